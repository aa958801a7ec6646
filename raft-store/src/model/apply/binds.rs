//! Applying whole-GPU placements: every bind re-checked (the check that keeps each GPU held by at
//! most one live job), then the GPUs marked held and the job Bound with a new generation.

use crate::model::command::Bind;
use crate::model::job::{Binding, Job, JobKind, JobState, MAX_RUNS_KEPT, Run};
use crate::model::node::{NodeRecord, gpu_fits};
use crate::model::outcome::ApplyResult;
use crate::model::partition::{GpuMode, Slice};
use crate::model::state::ClusterState;
use crate::{JobId, NodeId};

impl ClusterState {
    pub(crate) fn bind_all(&mut self, binds: &[Bind], now: u64) -> ApplyResult {
        let mut bound = Vec::new();
        let mut rejected = Vec::new();
        let mut gangs_seen = std::collections::BTreeSet::new();
        for b in binds {
            let gang = self.jobs.get(&b.job).is_some_and(|j| j.spec.nodes > 1);
            if gang {
                // All of a gang's binds, in rank order, at its first: all or nothing.
                if !gangs_seen.insert(b.job) {
                    continue;
                }
                let members: Vec<&Bind> = binds.iter().filter(|m| m.job == b.job).collect();
                match self
                    .due(b.job, now)
                    .and_then(|()| self.check_gang(&members))
                {
                    Ok(()) => {
                        self.bind_gang(&members, now);
                        bound.push(b.job);
                    }
                    Err(reason) => rejected.push((b.job, reason)),
                }
                continue;
            }
            match self.due(b.job, now).and_then(|()| self.check_bind(b)) {
                Ok(()) => {
                    self.bind(b, now);
                    bound.push(b.job);
                }
                Err(reason) => rejected.push((b.job, reason)),
            }
        }
        ApplyResult::Bound { bound, rejected }
    }

    /// Whether `b` may be applied now: the P4 check. Every condition is re-checked here no
    /// matter what the scheduler believed.
    pub fn check_bind(&self, b: &Bind) -> Result<(), String> {
        let (job, node) = self.placement_target(b.job, b.node)?;
        if job.spec.slice.is_some() {
            return Err(format!(
                "job j-{} asks for a GPU slice: it is bound with BindSlices",
                b.job
            ));
        }
        let wanted_mode = match job.spec.kind {
            JobKind::Process => GpuMode::Whole,
            JobKind::Vm => GpuMode::Passthrough,
        };
        let per_node = job.spec.gpus_per_node() as usize;
        if b.gpus.len() != per_node {
            return Err(format!(
                "job j-{} needs {per_node} GPUs on each node, bind gives {}",
                b.job,
                b.gpus.len()
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for &index in &b.gpus {
            if !seen.insert(index) {
                return Err(format!("GPU {index} appears twice"));
            }
            check_gpu_free(b, node, index, wanted_mode, job)?;
        }
        Ok(())
    }

    /// A job requeued after a failed run is not placed before its retry time, nor a held
    /// one, one whose dependencies are not met or a singleton whose namesake runs, whatever
    /// the scheduler believed (`now` is the bind's proposal time, the leader's clock).
    pub(crate) fn due(&self, job: JobId, now: u64) -> Result<(), String> {
        let Some(j) = self.jobs.get(&job) else {
            return Ok(());
        };
        if let Some(why) = self.gate(j) {
            return Err(format!("job j-{job} may not start yet: {why}"));
        }
        match j.not_before_ms {
            Some(t) if t > now => Err(format!(
                "job j-{job} waits to retry for another {} ms",
                t - now
            )),
            _ => Ok(()),
        }
    }

    /// The common ground of every placement (`check_bind`, `check_slice_bind`): `job` exists
    /// and is Pending, `node` is registered, accepts work and has every label the job selects.
    pub(crate) fn placement_target(
        &self,
        job: JobId,
        node: NodeId,
    ) -> Result<(&Job, &NodeRecord), String> {
        let j = self
            .jobs
            .get(&job)
            .ok_or_else(|| format!("job j-{job} does not exist"))?;
        if j.state != JobState::Pending {
            return Err(format!("job j-{job} is {}, not Pending", j.state));
        }
        let n = self
            .nodes
            .get(&node)
            .ok_or_else(|| format!("node n{node} is not registered"))?;
        if !n.accepts_work() {
            return Err(format!("node n{node} does not accept work"));
        }
        let labels = n.effective_labels();
        if let Some((k, v)) = j
            .spec
            .node_selector
            .iter()
            .find(|(k, v)| labels.get(*k) != Some(*v))
        {
            return Err(format!("node n{node} does not have label {k}={v}"));
        }
        Ok((j, n))
    }

    pub(crate) fn bind(&mut self, b: &Bind, now: u64) {
        // A deliberate bug for chaos tests (never on outside a failpoints build).
        let forget = crate::failpoint::on("apply-bind-forgets-gpus");
        if let Some(node) = self.nodes.get_mut(&b.node)
            && !forget
        {
            for &index in &b.gpus {
                node.allocations.insert(index, b.job);
            }
        }
        self.mark_bound(b.job, b.node, b.gpus.clone(), None, now);
    }

    /// The job side of a bind: a new generation, Bound, its binding.
    pub(crate) fn mark_bound(
        &mut self,
        job: JobId,
        node: NodeId,
        gpus: Vec<u32>,
        slice: Option<Slice>,
        now: u64,
    ) {
        if let Some(job) = self.jobs.get_mut(&job) {
            self.job_log.record(job.id);
            job.generation += 1;
            job.attempts += 1;
            job.state = JobState::Bound;
            job.binding = Some(Binding {
                node,
                gpus,
                generation: job.generation,
                slice,
            });
            job.bound_at_ms = Some(now);
            job.reason = None;
            job.preempted_for = None;
            job.not_before_ms = None;
            job.phase = None;
            job.gang.clear();
            job.gang_done.clear();
            job.record_run(node, now);
        }
        // At once, so the next bind of the same entry sees its array's limit reached.
        self.track_array_task(job);
    }
}

/// Whether GPU `index` of `node` may go whole to `job` (as bind `b` asks): present, healthy, not quarantined, held
/// by nobody (whole or sliced), not draining, in the mode the job's kind needs, and matching its
/// selector.
fn check_gpu_free(
    b: &Bind,
    node: &NodeRecord,
    index: u32,
    wanted_mode: GpuMode,
    job: &Job,
) -> Result<(), String> {
    let gpu = node
        .gpu(index)
        .ok_or_else(|| format!("node n{} has no GPU {index}", b.node))?;
    if !gpu.healthy {
        return Err(format!("GPU n{}/{index} is unhealthy", b.node));
    }
    if let Some(rule) = node.quarantined.get(&index) {
        return Err(format!("GPU n{}/{index} is quarantined ({rule})", b.node));
    }
    if let Some(holder) = node.allocations.get(&index) {
        return Err(format!("GPU n{}/{index} is held by j-{holder}", b.node));
    }
    if node.gpu_busy(index) {
        return Err(format!("GPU n{}/{index} has slices in use", b.node));
    }
    if node.draining(index) {
        return Err(format!(
            "GPU n{}/{index} is draining for a partition change",
            b.node
        ));
    }
    let mode = node.mode(index);
    if mode != wanted_mode {
        return Err(format!(
            "GPU n{}/{index} is in {} mode; j-{} needs a {} GPU",
            b.node,
            mode.name(),
            b.job,
            wanted_mode.name()
        ));
    }
    if !gpu_fits(gpu, &job.spec) {
        return Err(format!(
            "GPU n{}/{index} ({}) does not match the job's selector",
            b.node, gpu.model
        ));
    }
    Ok(())
}

impl Job {
    /// Start the record of the run just bound (its nodes: this one; a gang's are filled in by
    /// `bind_gang`), dropping the oldest records beyond `MAX_RUNS_KEPT`.
    fn record_run(&mut self, node: NodeId, now: u64) {
        if self.runs.len() >= MAX_RUNS_KEPT {
            let excess = self.runs.len() + 1 - MAX_RUNS_KEPT;
            self.runs.drain(..excess);
        }
        self.runs.push(Run {
            attempt: self.attempts,
            generation: self.generation,
            nodes: vec![node],
            bound_at_ms: now,
            started_at_ms: None,
            finished_at_ms: None,
            outcome: None,
        });
    }
}
