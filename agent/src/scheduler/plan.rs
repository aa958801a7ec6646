//! `plan`: placements for pending jobs, computed from the applied state alone (no I/O, no
//! clock). Policy v1: highest priority first, then submission order; whole GPUs on one node;
//! best fit (the node with the fewest free matching GPUs that still fits, keeping big holes
//! for big jobs); inside a node, GPUs of one NUMA node when possible.

use std::collections::{BTreeMap, BTreeSet};

use gpu_raft_store::{
    Bind, ClusterState, GpuRecord, Job, JobId, JobSpec, JobState, NodeId, gpu_fits,
};

#[derive(Clone, Debug)]
pub struct Policy {
    /// Most placements proposed in one pass (one Raft entry).
    pub max_binds_per_pass: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            max_binds_per_pass: 1024,
        }
    }
}

/// One pass's result: placements to propose, and new reasons for jobs that stay pending.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub binds: Vec<Bind>,
    /// Only reasons that differ from what the state already says.
    pub unschedulable: Vec<(JobId, String)>,
}

struct Candidate<'a> {
    id: NodeId,
    labels: BTreeMap<String, String>,
    free: Vec<&'a GpuRecord>,
    all: Vec<&'a GpuRecord>,
}

pub fn plan(state: &ClusterState, policy: &Policy) -> Plan {
    let mut pending: Vec<&Job> = state
        .jobs
        .values()
        .filter(|j| j.state == JobState::Pending)
        .collect();
    pending.sort_by_key(|j| (std::cmp::Reverse(j.spec.priority), j.id));
    let mut nodes: Vec<Candidate<'_>> = state
        .nodes
        .values()
        .filter(|n| n.accepts_work())
        .map(|n| Candidate {
            id: n.id,
            labels: n.effective_labels(),
            free: n.free_gpus().collect(),
            all: n.inventory.gpus.iter().collect(),
        })
        .collect();

    let mut out = Plan::default();
    for job in pending {
        if out.binds.len() >= policy.max_binds_per_pass {
            break;
        }
        match place(&job.spec, &nodes) {
            Some((slot, gpus)) => {
                let node = &mut nodes[slot];
                node.free.retain(|g| !gpus.contains(&g.index));
                out.binds.push(Bind {
                    job: job.id,
                    node: node.id,
                    gpus,
                });
            }
            None => {
                let reason = why_unplaceable(&job.spec, &nodes);
                if job.reason.as_deref() != Some(reason.as_str()) {
                    out.unschedulable.push((job.id, reason));
                }
            }
        }
    }
    out
}

/// The best node (index into `nodes`) and GPU indexes for `spec`, if any node fits.
fn place(spec: &JobSpec, nodes: &[Candidate<'_>]) -> Option<(usize, Vec<u32>)> {
    let want = spec.gpus as usize;
    nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| selector_matches(spec, &n.labels))
        .filter_map(|(i, n)| {
            let fitting: Vec<&GpuRecord> = n
                .free
                .iter()
                .copied()
                .filter(|g| gpu_fits(g, spec))
                .collect();
            (fitting.len() >= want).then_some((i, fitting))
        })
        .min_by_key(|(i, fitting)| (fitting.len(), nodes[*i].id))
        .map(|(i, fitting)| (i, pick_gpus(&fitting, want)))
}

/// `want` GPUs from `fitting`, from a single NUMA node when one can hold them all (the one with
/// the fewest spare GPUs), else the lowest indexes.
fn pick_gpus(fitting: &[&GpuRecord], want: usize) -> Vec<u32> {
    let mut by_numa: BTreeMap<Option<u32>, Vec<u32>> = BTreeMap::new();
    for g in fitting {
        by_numa.entry(g.numa_node).or_default().push(g.index);
    }
    let mut gpus = by_numa
        .values()
        .filter(|group| group.len() >= want)
        .min_by_key(|group| group.len())
        .cloned()
        .unwrap_or_else(|| fitting.iter().map(|g| g.index).collect());
    gpus.sort_unstable();
    gpus.truncate(want);
    gpus
}

fn selector_matches(spec: &JobSpec, labels: &BTreeMap<String, String>) -> bool {
    spec.node_selector
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
}

/// A user-facing reason: impossible anywhere, or waiting for capacity.
fn why_unplaceable(spec: &JobSpec, nodes: &[Candidate<'_>]) -> String {
    let what = describe(spec);
    let eligible: Vec<&Candidate<'_>> = nodes
        .iter()
        .filter(|n| selector_matches(spec, &n.labels))
        .collect();
    if eligible.is_empty() {
        return if spec.node_selector.is_empty() {
            "no node accepts work".to_owned()
        } else {
            "no schedulable node matches the node selector".to_owned()
        };
    }
    let largest = eligible
        .iter()
        .map(|n| n.all.iter().filter(|g| gpu_fits(g, spec)).count())
        .max()
        .unwrap_or(0);
    if largest < spec.gpus as usize {
        format!("no schedulable node has {what} (the most any has is {largest})")
    } else {
        format!("waiting for {what} to be free")
    }
}

fn describe(spec: &JobSpec) -> String {
    let types: BTreeSet<&str> = spec.gpu_types.iter().map(String::as_str).collect();
    let mut s = format!("{} GPU{}", spec.gpus, if spec.gpus == 1 { "" } else { "s" });
    if !types.is_empty() {
        s.push_str(&format!(
            " of type {}",
            types.into_iter().collect::<Vec<_>>().join("|")
        ));
    }
    if spec.min_gpu_memory_mib > 0 {
        s.push_str(&format!(" with at least {} MiB", spec.min_gpu_memory_mib));
    }
    s
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use gpu_raft_store::{ApplyResult, Command, Inventory, LogEntry};
    use proptest::prelude::*;

    use super::*;

    fn gpu(index: u32, gpu_type: &str, numa: u32) -> GpuRecord {
        GpuRecord {
            index,
            uuid: format!("GPU-{index}"),
            model: format!("{gpu_type}-80GB"),
            gpu_type: gpu_type.into(),
            memory_mib: if gpu_type == "T4" { 15360 } else { 81920 },
            numa_node: Some(numa),
            nvlink_peers: vec![],
            healthy: true,
        }
    }

    fn apply(s: &mut ClusterState, cmd: Command) -> ApplyResult {
        s.apply(&LogEntry {
            proposed_at_ms: 1,
            cmd,
            meta: None,
        })
    }

    fn node(s: &mut ClusterState, id: NodeId, gpus: Vec<GpuRecord>) {
        let inventory = Inventory {
            gpus,
            cpu_cores: 8,
            memory_mib: 1 << 16,
        };
        apply(
            s,
            Command::RegisterNode {
                node: id,
                addr: format!("h:{id}"),
                labels: BTreeMap::new(),
                inventory,
            },
        );
    }

    fn spec(gpus: u32, priority: i32) -> JobSpec {
        JobSpec {
            name: "j".into(),
            tenant: "default".into(),
            command: vec!["true".into()],
            env: BTreeMap::new(),
            workdir: None,
            gpus,
            gpu_types: BTreeSet::new(),
            min_gpu_memory_mib: 0,
            node_selector: BTreeMap::new(),
            priority,
            runtime_estimate_s: None,
            wall_time_limit_s: None,
            max_attempts: 1,
            cpu_millis: None,
            memory_mib: None,
        }
    }

    fn submit(s: &mut ClusterState, spec: JobSpec) {
        apply(
            s,
            Command::SubmitJob {
                spec,
                idempotency_key: None,
            },
        );
    }

    #[test]
    fn best_fit_leaves_the_big_node_for_the_big_job() {
        let mut s = ClusterState::new();
        node(&mut s, 1, (0..8).map(|i| gpu(i, "A100", i / 4)).collect());
        node(&mut s, 2, (0..2).map(|i| gpu(i, "A100", 0)).collect());
        submit(&mut s, spec(1, 0));
        submit(&mut s, spec(8, 0));
        let p = plan(&s, &Policy::default());
        assert_eq!(
            p.binds,
            vec![
                Bind {
                    job: 1,
                    node: 2,
                    gpus: vec![0]
                },
                Bind {
                    job: 2,
                    node: 1,
                    gpus: (0..8).collect()
                }
            ]
        );
    }

    #[test]
    fn priority_then_submission_order() {
        let mut s = ClusterState::new();
        node(&mut s, 1, vec![gpu(0, "A100", 0)]);
        submit(&mut s, spec(1, 0));
        submit(&mut s, spec(1, 5));
        let p = plan(&s, &Policy::default());
        assert_eq!(
            p.binds,
            vec![Bind {
                job: 2,
                node: 1,
                gpus: vec![0]
            }]
        );
        assert_eq!(
            p.unschedulable,
            vec![(1, "waiting for 1 GPU to be free".to_owned())]
        );
    }

    #[test]
    fn gpus_come_from_one_numa_node_when_possible() {
        let mut s = ClusterState::new();
        node(
            &mut s,
            1,
            vec![
                gpu(0, "A100", 0),
                gpu(1, "A100", 1),
                gpu(2, "A100", 1),
                gpu(3, "A100", 0),
            ],
        );
        submit(&mut s, spec(2, 0));
        assert_eq!(plan(&s, &Policy::default()).binds[0].gpus, vec![0, 3]);
    }

    #[test]
    fn impossible_jobs_say_why_and_stay_pending() {
        let mut s = ClusterState::new();
        node(&mut s, 1, vec![gpu(0, "T4", 0), gpu(1, "T4", 0)]);
        submit(&mut s, spec(4, 0));
        submit(
            &mut s,
            JobSpec {
                gpu_types: BTreeSet::from(["H100".into()]),
                ..spec(1, 0)
            },
        );
        submit(
            &mut s,
            JobSpec {
                node_selector: BTreeMap::from([("site".into(), "edge".into())]),
                ..spec(0, 0)
            },
        );
        let p = plan(&s, &Policy::default());
        assert!(p.binds.is_empty());
        let reasons: BTreeMap<JobId, String> = p.unschedulable.iter().cloned().collect();
        assert_eq!(
            reasons[&1],
            "no schedulable node has 4 GPUs (the most any has is 2)"
        );
        assert_eq!(
            reasons[&2],
            "no schedulable node has 1 GPU of type H100 (the most any has is 0)"
        );
        assert_eq!(reasons[&3], "no schedulable node matches the node selector");
        // Reasons already recorded are not proposed again.
        apply(
            &mut s,
            Command::NoteUnschedulable {
                reasons: p.unschedulable,
            },
        );
        assert!(plan(&s, &Policy::default()).unschedulable.is_empty());
    }

    #[test]
    fn cpu_only_jobs_are_placed_without_gpus() {
        let mut s = ClusterState::new();
        node(&mut s, 1, vec![]);
        submit(&mut s, spec(0, 0));
        assert_eq!(
            plan(&s, &Policy::default()).binds,
            vec![Bind {
                job: 1,
                node: 1,
                gpus: vec![]
            }]
        );
    }

    fn arb_gpu_type() -> impl Strategy<Value = &'static str> {
        prop_oneof![Just("A100"), Just("T4"), Just("H100")]
    }

    proptest! {
        /// For random clusters and job mixes, plan + apply never binds a GPU twice and never
        /// binds a GPU that fails the job's selector; every planned bind applies.
        #[test]
        fn plan_then_apply_is_always_valid(
            nodes in proptest::collection::vec(proptest::collection::vec((arb_gpu_type(), 0u32..2), 0..6), 1..5),
            jobs in proptest::collection::vec((0u32..5, proptest::option::of(arb_gpu_type()), -2i32..3), 1..30),
            rounds in 1usize..4,
        ) {
            let mut s = ClusterState::new();
            for (i, gpus) in nodes.iter().enumerate() {
                let gpus = gpus.iter().enumerate().map(|(g, (t, numa))| gpu(g as u32, t, *numa)).collect();
                node(&mut s, i as u64 + 1, gpus);
            }
            for (gpus, ty, prio) in &jobs {
                let gpu_types = ty.map(|t| BTreeSet::from([t.to_owned()])).unwrap_or_default();
                submit(&mut s, JobSpec { gpu_types, ..spec(*gpus, *prio) });
            }
            for _ in 0..rounds {
                let p = plan(&s, &Policy::default());
                let n = p.binds.len();
                let ApplyResult::Bound { bound, rejected } = apply(&mut s, Command::BindJobs { binds: p.binds.clone() }) else {
                    panic!("bind result");
                };
                prop_assert!(rejected.is_empty(), "a fresh plan must apply cleanly: {:?}", rejected);
                prop_assert_eq!(bound.len(), n);
                for b in &p.binds {
                    let job = &s.jobs[&b.job];
                    for g in &b.gpus {
                        prop_assert!(gpu_fits(s.nodes[&b.node].gpu(*g).expect("gpu"), &job.spec));
                    }
                }
                let mut seen = BTreeSet::new();
                for j in s.jobs.values().filter(|j| j.state.is_live()) {
                    let b = j.binding.as_ref().expect("binding");
                    for g in &b.gpus {
                        prop_assert!(seen.insert((b.node, *g)), "GPU n{}/{} bound twice", b.node, g);
                    }
                }
                // A stale replay of the same plan must be refused entirely.
                let ApplyResult::Bound { bound, .. } = apply(&mut s, Command::BindJobs { binds: p.binds }) else {
                    panic!("bind result");
                };
                prop_assert!(bound.is_empty(), "a replayed plan must not bind again");
            }
        }
    }
}
