//! Applying gangs: all of a gang's binds checked before any is made, and a gang that succeeds
//! only when every member has exited 0.

use crate::model::command::Bind;
use crate::model::job::{Binding, Outcome};
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::state::ClusterState;
use crate::{JobId, NodeId};

impl ClusterState {
    /// A gang's binds: one per member node, distinct nodes, each passing `check_bind`.
    pub(crate) fn check_gang(&self, members: &[&Bind]) -> Result<(), String> {
        let Some(first) = members.first() else {
            return Err("an empty gang".into());
        };
        let job = self
            .jobs
            .get(&first.job)
            .ok_or_else(|| format!("job j-{} does not exist", first.job))?;
        let want = job.spec.node_count() as usize;
        if members.len() != want {
            return Err(format!(
                "gang j-{} needs {want} nodes, the binds name {}",
                first.job,
                members.len()
            ));
        }
        let mut nodes = std::collections::BTreeSet::new();
        for m in members {
            if !nodes.insert(m.node) {
                return Err(format!("gang j-{} names node n{} twice", m.job, m.node));
            }
            self.check_bind(m)?;
        }
        Ok(())
    }

    pub(crate) fn bind_gang(&mut self, members: &[&Bind], now: u64) {
        let Some(first) = members.first() else {
            return;
        };
        self.bind(first, now);
        for m in &members[1..] {
            if let Some(node) = self.nodes.get_mut(&m.node) {
                for &index in &m.gpus {
                    node.allocations.insert(index, m.job);
                }
            }
        }
        if let Some(job) = self.jobs.get_mut(&first.job) {
            let generation = job.generation;
            job.gang = members
                .iter()
                .map(|m| Binding {
                    node: m.node,
                    gpus: m.gpus.clone(),
                    generation,
                    slice: None,
                })
                .collect();
            let nodes = members.iter().map(|m| m.node).collect();
            if let Some(run) = job.run_mut(generation) {
                run.nodes = nodes;
            }
        }
    }

    pub(crate) fn member_finished(
        &mut self,
        job: JobId,
        generation: u64,
        node: NodeId,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let j = self.live_run(job, generation)?;
        if j.gang.is_empty() || !j.on_node(node) {
            return Err(invalid(format!(
                "job j-{job} has no gang member on node n{node}"
            )));
        }
        let members = j.gang.len();
        let j = self.job_mut(job)?;
        j.gang_done.insert(node);
        if j.gang_done.len() == members {
            return self.finished(job, generation, &Outcome::Exited { code: 0 }, now);
        }
        Ok(ApplyResult::Ok)
    }
}
