//! Which writes an agent may propose without a caller, in its own name: the reports about
//! itself (its registration, its runs, its alerts, its energy). The leader checks this against
//! the certificate of the agent that forwarded the proposal, so a compromised host can speak
//! only for itself: it cannot mint tokens, bind jobs, or report for another node.

use crate::NodeId;
use crate::model::command::Command;
use crate::model::state::ClusterState;

impl ClusterState {
    /// Whether `cmd` is node `node`'s own report: about itself, or about a run of a job placed
    /// on it.
    pub fn is_own_report(&self, node: NodeId, cmd: &Command) -> bool {
        let runs_here = |job| self.jobs.get(job).is_some_and(|j| j.on_node(node));
        match cmd {
            Command::RegisterNode { node: n, .. }
            | Command::GangMemberFinished { node: n, .. }
            | Command::RaiseAlert { node: n, .. }
            | Command::ResolveAlert { node: n, .. }
            | Command::ReportImages { node: n, .. }
            | Command::ReportTrust { node: n, .. } => *n == node,
            Command::RecordEnergy { report } => report.node == node,
            Command::JobStarted { job, .. }
            | Command::ReportRunPhase { job, .. }
            | Command::JobFinished { job, .. } => runs_here(job),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::auth::{Role, TokenRecord};
    use crate::model::command::{Bind, LogEntry};
    use crate::model::job::JobSpec;
    use crate::model::node::{GpuRecord, Inventory};

    fn apply(s: &mut ClusterState, cmd: Command) {
        s.apply(&LogEntry {
            proposed_at_ms: 1,
            cmd,
            meta: None,
            request: None,
        });
    }

    fn register(node: NodeId) -> Command {
        Command::RegisterNode {
            node,
            addr: format!("h:{node}"),
            labels: BTreeMap::new(),
            inventory: Inventory {
                gpus: vec![GpuRecord {
                    index: 0,
                    uuid: format!("GPU-{node}"),
                    model: "A100".into(),
                    gpu_type: "A100".into(),
                    memory_mib: 1024,
                    numa_node: None,
                    nvlink_peers: vec![],
                    healthy: true,
                }],
                cpu_cores: 1,
                memory_mib: 1024,
            },
            edge: None,
            protocol: 1,
        }
    }

    #[test]
    fn an_agent_speaks_only_for_itself_and_its_runs() {
        let mut s = ClusterState::new();
        apply(&mut s, register(1));
        apply(&mut s, register(2));
        let spec = JobSpec {
            name: "j".into(),
            command: vec!["true".into()],
            gpus: 1,
            ..JobSpec::default()
        };
        apply(&mut s, Command::submit(spec));
        let binds = vec![Bind {
            job: 1,
            node: 2,
            gpus: vec![0],
        }];
        apply(
            &mut s,
            Command::BindJobs {
                binds: binds.clone(),
            },
        );
        let started = Command::JobStarted {
            job: 1,
            generation: 1,
        };
        assert!(s.is_own_report(2, &register(2)));
        assert!(
            !s.is_own_report(1, &register(2)),
            "another node's registration"
        );
        assert!(s.is_own_report(2, &started));
        assert!(!s.is_own_report(1, &started), "a run placed elsewhere");
        let alert = Command::ResolveAlert {
            node: 2,
            gpu: 0,
            rule: "hot".into(),
        };
        assert!(s.is_own_report(2, &alert) && !s.is_own_report(1, &alert));
        let mint = Command::CreateToken {
            token: TokenRecord {
                id: "x".into(),
                secret_sha256: "ab".repeat(32),
                role: Role::Admin,
                tenant: None,
                description: String::new(),
                created_by: "system:forged".into(),
                created_at_ms: 1,
                revoked: false,
                account: None,
                limits: Default::default(),
            },
        };
        for never in [mint, Command::BindJobs { binds }] {
            assert!(!s.is_own_report(2, &never), "{never}");
        }
    }
}
