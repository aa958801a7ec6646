//! Foreign processes: a process on a GPU a job holds that is not that job's (the GPU backend's
//! process list: NVML's running processes, or for the simulator the processes with a
//! descriptor on its device node). Each sampling interval, every GPU of this node held by a
//! job is checked; a foreign process raises the `foreign-process` alert on the GPU (through
//! Raft, like every alert, and to the webhooks), and with `jobs.foreign_processes = "kill"` is
//! killed. The alert resolves once the GPU has no foreign process left.
//!
//! Which job a process is comes from `attribution`: its run cgroup where runs have cgroups.
//! Without job cgroups only the (forgeable) environment says, so nothing is killed there.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use gpu_raft_store::alert::{Remediation, Severity};
use gpu_raft_store::{ApplyResult, Command, JobId, NodeRecord};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Telemetry;
use super::attribution::owner_of_pid;
use super::webhook::{Event, Notice, Notifier};
use crate::raft::Cluster;

/// The alert's rule name (the agent's own: no configured rule of that name is needed, and the
/// alerting task leaves its alerts alone).
pub(crate) const RULE: &str = "foreign-process";

pub(crate) struct ForeignProcesses {
    pub cluster: Cluster,
    pub telemetry: Telemetry,
    pub notifier: Notifier,
    /// Kill foreign processes (`jobs.foreign_processes = "kill"`), not only report them.
    pub kill: bool,
    /// Runs have cgroups of their own on this host (so attribution is proof).
    pub job_cgroups: bool,
    pub interval: Duration,
}

/// Each GPU a job holds (whole, or a slice of it), and the jobs holding it.
pub(crate) fn holders(node: &NodeRecord) -> BTreeMap<u32, BTreeSet<JobId>> {
    let mut held: BTreeMap<u32, BTreeSet<JobId>> = BTreeMap::new();
    for (gpu, job) in &node.allocations {
        held.entry(*gpu).or_default().insert(*job);
    }
    for (gpu, slices) in &node.slices {
        held.entry(*gpu).or_default().extend(slices.keys());
    }
    held.retain(|_, jobs| !jobs.is_empty());
    held
}

/// The foreign processes of each held GPU: those on it (pid and the job each belongs to) that
/// none of its holders own. GPUs nobody holds are not judged.
pub(crate) fn foreign(
    holders: &BTreeMap<u32, BTreeSet<JobId>>,
    on_gpu: &BTreeMap<u32, Vec<(u32, Option<JobId>)>>,
) -> BTreeMap<u32, Vec<u32>> {
    on_gpu
        .iter()
        .filter_map(|(gpu, processes)| {
            let jobs = holders.get(gpu)?;
            let strangers: Vec<u32> = processes
                .iter()
                .filter(|(_, owner)| !owner.is_some_and(|j| jobs.contains(&j)))
                .map(|(pid, _)| *pid)
                .collect();
            (!strangers.is_empty()).then_some((*gpu, strangers))
        })
        .collect()
}

/// The alert's message for the foreign processes on a GPU.
pub(crate) fn message(
    gpu: u32,
    jobs: &BTreeSet<JobId>,
    processes: &[String],
    killed: bool,
) -> String {
    let jobs: Vec<String> = jobs.iter().map(|j| format!("j-{j}")).collect();
    format!(
        "{} on GPU {gpu}, held by {}{}",
        processes.join(", "),
        jobs.join(", "),
        if killed { ": killed" } else { "" }
    )
}

impl ForeignProcesses {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let node = self.cluster.id;
        let kill_them = self.kill && self.job_cgroups;
        // Each foreign process is logged once.
        let mut logged: BTreeSet<u32> = BTreeSet::new();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.interval) => {}
            }
            let (held, open) = self.cluster.state.read(|s| {
                let held = s.nodes.get(&node).map(holders).unwrap_or_default();
                let open: BTreeSet<u32> = s
                    .alerts
                    .values()
                    .filter(|a| a.is_open() && a.node == node && a.rule == RULE)
                    .map(|a| a.gpu)
                    .collect();
                (held, open)
            });
            let on_gpu: BTreeMap<u32, Vec<(u32, Option<JobId>)>> = self
                .telemetry
                .latest()
                .into_iter()
                .filter(|r| held.contains_key(&r.sample.index))
                .map(|r| {
                    let owned = r
                        .sample
                        .processes
                        .iter()
                        .map(|p| (p.pid, owner_of_pid(p.pid, self.job_cgroups)))
                        .collect();
                    (r.sample.index, owned)
                })
                .collect();
            let found = foreign(&held, &on_gpu);
            for (gpu, pids) in &found {
                let described: Vec<String> = pids.iter().map(|p| describe(*p)).collect();
                for (pid, who) in pids.iter().zip(&described) {
                    if logged.insert(*pid) {
                        warn!(gpu, pid, process = %who, kill = kill_them, "a foreign process is using a job's GPU");
                    }
                    if kill_them {
                        kill(Pid::from_raw(*pid as i32), Signal::SIGKILL).ok();
                    }
                }
                if !open.contains(gpu) {
                    let text = message(*gpu, &held[gpu], &described, kill_them);
                    self.raise(*gpu, text).await;
                }
            }
            logged.retain(|pid| found.values().any(|pids| pids.contains(pid)));
            for gpu in open.iter().filter(|g| !found.contains_key(g)) {
                self.resolve(*gpu).await;
            }
        }
    }

    async fn raise(&self, gpu: u32, message: String) {
        let cmd = Command::RaiseAlert {
            node: self.cluster.id,
            gpu,
            rule: RULE.into(),
            severity: Severity::Warning,
            remediation: Remediation::None,
            message: message.clone(),
        };
        match self.cluster.write(cmd).await {
            Ok(ApplyResult::AlertRaised {
                alert,
                existing: false,
            }) => {
                warn!(alert, gpu, %message, "alert raised");
                self.notify(Event::Raised, alert);
            }
            Ok(_) => {}
            Err(e) => {
                warn!(gpu, error = %e, "raising the foreign-process alert failed; will retry")
            }
        }
    }

    async fn resolve(&self, gpu: u32) {
        let cmd = Command::ResolveAlert {
            node: self.cluster.id,
            gpu,
            rule: RULE.into(),
        };
        match self.cluster.write(cmd).await {
            Ok(ApplyResult::AlertResolved { alert }) => {
                info!(
                    alert,
                    gpu, "no foreign process left on the GPU: alert resolved"
                );
                self.notify(Event::Resolved, alert);
            }
            Ok(_) => {}
            Err(e) => {
                warn!(gpu, error = %e, "resolving the foreign-process alert failed; will retry")
            }
        }
    }

    fn notify(&self, event: Event, id: u64) {
        if let Some(alert) = self.cluster.state.read(|s| s.alerts.get(&id).cloned()) {
            self.notifier.notify(Notice { event, alert });
        }
    }
}

/// `pid 1234 (python3, uid 1001)`, as far as `/proc` still says.
fn describe(pid: u32) -> String {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok();
    let uid = std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid());
    match (comm, uid) {
        (Some(comm), Some(uid)) => format!("pid {pid} ({}, uid {uid})", comm.trim()),
        _ => format!("pid {pid}"),
    }
}

#[cfg(test)]
mod tests {
    use gpu_raft_store::Slice;

    use super::*;

    #[test]
    fn holders_are_whole_gpus_and_slices() {
        let mut node: NodeRecord = serde_json::from_value(serde_json::json!({
            "id": 1, "addr": "a:1",
            "registered_at_ms": 0, "updated_at_ms": 0,
        }))
        .expect("node");
        node.allocations.insert(0, 7);
        node.slices.insert(
            1,
            BTreeMap::from([
                (
                    8,
                    Slice::Shared {
                        memory_mib: 1024,
                        share: 50,
                    },
                ),
                (
                    9,
                    Slice::Shared {
                        memory_mib: 1024,
                        share: 50,
                    },
                ),
            ]),
        );
        node.slices.insert(2, BTreeMap::new());
        let h = holders(&node);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h[&0], BTreeSet::from([7]));
        assert_eq!(h[&1], BTreeSet::from([8, 9]));
    }

    #[test]
    fn only_processes_no_holder_owns_are_foreign() {
        let holders = BTreeMap::from([(0, BTreeSet::from([7])), (1, BTreeSet::from([8, 9]))]);
        let on_gpu = BTreeMap::from([
            (0, vec![(100, Some(7)), (101, None), (102, Some(8))]),
            (1, vec![(200, Some(8)), (201, Some(9))]),
            // Nobody holds GPU 2: not judged.
            (2, vec![(300, None)]),
        ]);
        assert_eq!(
            foreign(&holders, &on_gpu),
            BTreeMap::from([(0, vec![101, 102])])
        );
        assert!(foreign(&BTreeMap::new(), &on_gpu).is_empty());
    }

    #[test]
    fn the_message_names_the_processes_and_the_jobs() {
        assert_eq!(
            message(
                0,
                &BTreeSet::from([7]),
                &["pid 101 (perl, uid 0)".into(), "pid 102".into()],
                true
            ),
            "pid 101 (perl, uid 0), pid 102 on GPU 0, held by j-7: killed"
        );
        assert_eq!(
            message(3, &BTreeSet::from([1, 2]), &["pid 5".into()], false),
            "pid 5 on GPU 3, held by j-1, j-2"
        );
    }
}
