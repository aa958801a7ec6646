//! GPU partitioning through `apply`: MIG layouts checked against the model's rules, slice
//! binds that never over-commit, layout changes that wait for a busy GPU to drain (never
//! stopping a job), pass-through GPUs only for `vm` jobs, and the over-commit invariants under
//! random command mixes.

use std::collections::BTreeSet;

use gpu_raft_store::mig::{self, Instance};
use gpu_raft_store::partition::FULL_SHARE;
use gpu_raft_store::testing::{self, gpu};
use gpu_raft_store::{
    ApplyResult, Bind, ClusterState, Command, GpuMode, JobKind, JobSpec, JobState, LogEntry,
    Outcome, PartitionSpec, Rejection, Slice, SliceBind, SliceRequest,
};
use proptest::prelude::*;

fn at(cmd: Command) -> LogEntry {
    testing::at(1_000, cmd)
}

/// n1: two A100-80GB and a T4.
fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    let gpus = vec![
        gpu(0, "A100-80GB", "A100", 81_920),
        gpu(1, "A100-80GB", "A100", 81_920),
        gpu(2, "T4-16GB", "T4", 15_360),
    ];
    let r = s.apply(&at(testing::register(1, gpus)));
    assert_eq!(r, ApplyResult::Ok);
    s
}

fn spec(gpus: u32, slice: Option<SliceRequest>) -> JobSpec {
    JobSpec {
        max_attempts: 1,
        slice,
        ..testing::spec(gpus)
    }
}

fn mig_req(p: &str) -> Option<SliceRequest> {
    Some(SliceRequest::Mig { profile: p.into() })
}

fn shared_req(memory_mib: u64, share: u32) -> Option<SliceRequest> {
    Some(SliceRequest::Shared { memory_mib, share })
}

fn submit(s: &mut ClusterState, spec: JobSpec) -> u64 {
    match s.apply(&at(Command::submit(spec))) {
        ApplyResult::JobSubmitted { job, .. } => job,
        other => panic!("submit: {other:?}"),
    }
}

fn layout(items: &[(&str, u8)]) -> Vec<Instance> {
    items
        .iter()
        .map(|(p, start)| Instance {
            profile: (*p).into(),
            start: *start,
        })
        .collect()
}

fn set(gpu: u32, mode: GpuMode, mig: Vec<Instance>, if_idle: bool) -> Command {
    Command::SetGpuPartition {
        node: 1,
        gpu,
        partition: PartitionSpec { mode, mig },
        if_idle,
    }
}

fn apply_slice(s: &mut ClusterState, job: u64, gpu: u32, slice: Slice) -> ApplyResult {
    s.apply(&at(Command::BindSlices {
        binds: vec![SliceBind {
            job,
            node: 1,
            gpu,
            slice,
        }],
    }))
}

fn mig(profile: &str, start: u8) -> Slice {
    Slice::Mig {
        profile: profile.into(),
        start,
    }
}

fn finish(s: &mut ClusterState, job: u64) {
    let generation = s.jobs[&job].generation;
    let r = s.apply(&at(Command::JobFinished {
        job,
        generation,
        outcome: Outcome::Exited { code: 0 },
    }));
    assert_eq!(r, ApplyResult::Ok);
}

fn rejected(r: &ApplyResult) -> Vec<String> {
    match r {
        ApplyResult::Bound { rejected, .. } => {
            rejected.iter().map(|(_, why)| why.clone()).collect()
        }
        other => panic!("not a bind result: {other:?}"),
    }
}

#[test]
fn mig_layouts_follow_the_model_rules_and_bad_ones_change_nothing() {
    let mut s = cluster();
    let before = s.clone();
    let bad = [
        (
            set(0, GpuMode::Mig, layout(&[("1g.5gb", 0)]), false),
            "A100-80GB does not support MIG profile 1g.5gb",
        ),
        (
            set(
                0,
                GpuMode::Mig,
                layout(&[("4g.40gb", 0), ("3g.40gb", 2)]),
                false,
            ),
            "may start at memory slice [0, 4], not 2",
        ),
        (
            set(
                0,
                GpuMode::Mig,
                layout(&[("4g.40gb", 0), ("2g.20gb", 2)]),
                false,
            ),
            "overlaps another instance",
        ),
        (
            set(2, GpuMode::Mig, vec![], false),
            "T4-16GB is not MIG-capable",
        ),
        (
            set(0, GpuMode::Shared, layout(&[("1g.10gb", 0)]), false),
            "a MIG layout needs mode mig",
        ),
        (set(7, GpuMode::Shared, vec![], false), "has no GPU 7"),
    ];
    for (cmd, why) in bad {
        match s.apply(&at(cmd)) {
            ApplyResult::Rejected {
                reason: Rejection::Invalid { message },
            } => assert!(message.contains(why), "{message} should say {why}"),
            other => panic!("expected a rejection ({why}), got {other:?}"),
        }
        assert_eq!(s, before, "a rejected partition change must change nothing");
    }
    let seven = layout(&(0..7).map(|i| ("1g.10gb", i)).collect::<Vec<_>>());
    assert_eq!(
        s.apply(&at(set(0, GpuMode::Mig, seven.clone(), false))),
        ApplyResult::Ok
    );
    assert_eq!(s.nodes[&1].partition(0).mig, seven);
    // A MIG or shared GPU is no longer a whole GPU.
    let free: Vec<u32> = s.nodes[&1].free_gpus().map(|g| g.index).collect();
    assert_eq!(free, vec![1, 2]);
}

#[test]
fn slices_are_never_over_committed() {
    let mut s = cluster();
    s.apply(&at(set(
        0,
        GpuMode::Mig,
        layout(&[("3g.40gb", 0), ("3g.40gb", 4)]),
        false,
    )));
    s.apply(&at(set(1, GpuMode::Shared, vec![], false)));
    let a = submit(&mut s, spec(1, mig_req("3g.40gb")));
    let b = submit(&mut s, spec(1, mig_req("3g.40gb")));
    let c = submit(&mut s, spec(1, mig_req("3g.40gb")));
    assert_eq!(
        apply_slice(&mut s, a, 0, mig("3g.40gb", 0)),
        ApplyResult::Bound {
            bound: vec![a],
            rejected: vec![]
        }
    );
    // The same instance twice, an instance not in the layout, the wrong profile.
    let r = apply_slice(&mut s, b, 0, mig("3g.40gb", 0));
    assert_eq!(rejected(&r), ["GPU n1/0 instance 3g.40gb@0 is held by j-1"]);
    let r = apply_slice(&mut s, b, 0, mig("4g.40gb", 0));
    assert_eq!(rejected(&r), ["j-2 asks for 3g.40gb, bind gives 4g.40gb"]);
    let r = apply_slice(&mut s, b, 0, mig("3g.40gb", 2));
    assert_eq!(rejected(&r), ["GPU n1/0 has no MIG instance 3g.40gb@2"]);
    assert!(matches!(
        apply_slice(&mut s, b, 0, mig("3g.40gb", 4)),
        ApplyResult::Bound { ref bound, .. } if bound == &[b]
    ));
    let r = apply_slice(&mut s, c, 1, mig("3g.40gb", 0));
    assert_eq!(rejected(&r), ["GPU n1/1 is in shared mode, not mig"]);
    // The whole GPU 0 is not free for whole-GPU jobs.
    let whole = submit(&mut s, spec(1, None));
    let r = s.apply(&at(Command::BindJobs {
        binds: vec![Bind {
            job: whole,
            node: 1,
            gpus: vec![0],
        }],
    }));
    assert_eq!(rejected(&r), ["GPU n1/0 has slices in use"]);

    // Shared GPU 1 (81920 MiB, 100%): 60 + 30 fit, then 20% more does not, nor 30 GiB.
    let share = |s: &mut ClusterState, memory_mib, share| {
        let j = submit(s, spec(1, shared_req(memory_mib, share)));
        let r = apply_slice(s, j, 1, Slice::Shared { memory_mib, share });
        (j, r)
    };
    let (d, r) = share(&mut s, 40_960, 60);
    assert!(rejected(&r).is_empty());
    let (_, r) = share(&mut s, 20_480, 30);
    assert!(rejected(&r).is_empty());
    let (_, r) = share(&mut s, 1024, 20);
    assert_eq!(
        rejected(&r),
        ["GPU n1/1 has 10% of its compute left, j-7 needs 20%"]
    );
    let (_, r) = share(&mut s, 30_720, 5);
    assert_eq!(
        rejected(&r),
        ["GPU n1/1 has 20480 MiB of 81920 MiB left, j-8 needs 30720 MiB"]
    );
    // A bind that misstates the request is refused.
    let e = submit(&mut s, spec(1, shared_req(1024, 5)));
    let r = apply_slice(
        &mut s,
        e,
        1,
        Slice::Shared {
            memory_mib: 1,
            share: 1,
        },
    );
    assert_eq!(
        rejected(&r),
        ["j-9 asks for 1024 MiB/5%, bind gives 1 MiB/1%"]
    );
    // Ending a run gives its share back.
    finish(&mut s, d);
    assert_eq!(s.nodes[&1].shared_used(1), (20_480, 30));
    let r = apply_slice(
        &mut s,
        e,
        1,
        Slice::Shared {
            memory_mib: 1024,
            share: 5,
        },
    );
    assert!(rejected(&r).is_empty());
    // A sliced job's GPU time counts its fraction: 3 of 7 compute slices.
    let generation = s.jobs[&a].generation;
    s.apply(&LogEntry {
        proposed_at_ms: 8_000,
        ..at(Command::JobFinished {
            job: a,
            generation,
            outcome: Outcome::Exited { code: 0 },
        })
    });
    assert_eq!(s.jobs[&a].gpu_ms.get("A100"), Some(&3_000));
}

#[test]
fn a_layout_change_on_a_busy_gpu_waits_for_the_drain_and_never_stops_a_job() {
    let mut s = cluster();
    s.apply(&at(set(
        0,
        GpuMode::Mig,
        layout(&[("4g.40gb", 0), ("3g.40gb", 4)]),
        false,
    )));
    let a = submit(&mut s, spec(1, mig_req("4g.40gb")));
    apply_slice(&mut s, a, 0, mig("4g.40gb", 0));
    // Keeping the held instance: in force at once (MIG instances can change beside a busy one).
    let keep = layout(&[("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]);
    assert_eq!(
        s.apply(&at(set(0, GpuMode::Mig, keep.clone(), false))),
        ApplyResult::Ok
    );
    assert_eq!(s.nodes[&1].partition(0).mig, keep);
    assert!(!s.nodes[&1].draining(0));
    // The leader's re-slicing of a busy GPU is refused; nothing changes.
    let before = s.clone();
    let seven = layout(&(0..7).map(|i| ("1g.10gb", i)).collect::<Vec<_>>());
    let r = s.apply(&at(set(0, GpuMode::Mig, seven.clone(), true)));
    assert!(matches!(r, ApplyResult::Rejected { .. }), "{r:?}");
    assert_eq!(s, before);
    // An operator's change that drops the held instance waits; the GPU drains.
    assert_eq!(
        s.apply(&at(set(0, GpuMode::Mig, seven.clone(), false))),
        ApplyResult::Ok
    );
    assert_eq!(s.nodes[&1].partition(0).mig, keep, "still the old layout");
    assert!(s.nodes[&1].draining(0));
    assert_eq!(
        s.jobs[&a].state,
        JobState::Bound,
        "the running job is untouched"
    );
    assert!(!s.jobs[&a].evict_requested);
    let b = submit(&mut s, spec(1, mig_req("2g.20gb")));
    let r = apply_slice(&mut s, b, 0, mig("2g.20gb", 4));
    assert_eq!(
        rejected(&r),
        ["GPU n1/0 is draining for a partition change"]
    );
    // The job ends: the new layout takes effect.
    finish(&mut s, a);
    assert_eq!(s.nodes[&1].partition(0).mig, seven);
    assert!(!s.nodes[&1].draining(0));
    // Back to whole: the partition record goes away entirely.
    assert_eq!(
        s.apply(&at(set(0, GpuMode::Whole, vec![], false))),
        ApplyResult::Ok
    );
    assert!(s.nodes[&1].partitions.is_empty());
}

#[test]
fn pass_through_gpus_go_only_to_vm_jobs() {
    let mut s = cluster();
    s.apply(&at(set(1, GpuMode::Passthrough, vec![], false)));
    let vm = submit(
        &mut s,
        JobSpec {
            kind: JobKind::Vm,
            ..spec(1, None)
        },
    );
    let process = submit(&mut s, spec(1, None));
    let bind = |job, gpu| Command::BindJobs {
        binds: vec![Bind {
            job,
            node: 1,
            gpus: vec![gpu],
        }],
    };
    let r = s.apply(&at(bind(process, 1)));
    assert_eq!(
        rejected(&r),
        ["GPU n1/1 is in passthrough mode; j-2 needs a whole GPU"]
    );
    let r = s.apply(&at(bind(vm, 0)));
    assert_eq!(
        rejected(&r),
        ["GPU n1/0 is in whole mode; j-1 needs a passthrough GPU"]
    );
    let r = s.apply(&at(bind(vm, 1)));
    assert!(rejected(&r).is_empty());
    assert_eq!(s.nodes[&1].allocations.get(&1), Some(&vm));
    // A sliced job is never bound whole.
    let sliced = submit(&mut s, spec(1, shared_req(1024, 10)));
    let r = s.apply(&at(bind(sliced, 0)));
    assert_eq!(
        rejected(&r),
        ["job j-3 asks for a GPU slice: it is bound with BindSlices"]
    );
}

/// Every partition invariant at once.
fn check_invariants(s: &ClusterState) -> Result<(), String> {
    for n in s.nodes.values() {
        for (gpu, p) in &n.partitions {
            let g = n.gpu(*gpu).ok_or("partition of a missing GPU")?;
            if p.current.mode == GpuMode::Mig {
                mig::model(&g.model)
                    .ok_or("MIG on a model without MIG")?
                    .check(&p.current.mig)
                    .map_err(|e| format!("layout in force is invalid: {e}"))?;
            } else if !p.current.mig.is_empty() {
                return Err("a MIG layout outside MIG mode".into());
            }
        }
        for (gpu, holds) in &n.slices {
            let g = n.gpu(*gpu).ok_or("slice of a missing GPU")?;
            if n.allocations.contains_key(gpu) {
                return Err(format!("GPU {gpu} is held whole and sliced"));
            }
            let mode = n.mode(*gpu);
            let mut starts = BTreeSet::new();
            let (mut memory, mut share) = (0, 0);
            for (job, slice) in holds {
                let j = &s.jobs[job];
                if !j.state.is_live() {
                    return Err(format!("j-{job} holds a slice but is {}", j.state));
                }
                match slice {
                    Slice::Mig { profile, start } => {
                        let instance = Instance {
                            profile: profile.clone(),
                            start: *start,
                        };
                        if mode != GpuMode::Mig || !n.partition(*gpu).mig.contains(&instance) {
                            return Err(format!("{instance} held but not in the layout"));
                        }
                        if !starts.insert(*start) {
                            return Err(format!("{instance} held twice"));
                        }
                    }
                    Slice::Shared {
                        memory_mib,
                        share: pct,
                    } => {
                        if mode != GpuMode::Shared {
                            return Err("a share on a GPU not in shared mode".into());
                        }
                        memory += memory_mib;
                        share += pct;
                    }
                }
            }
            if memory > g.memory_mib || share > FULL_SHARE {
                return Err(format!("GPU {gpu} over-committed: {memory} MiB, {share}%"));
            }
        }
        for gpu in n.allocations.keys() {
            if !matches!(n.mode(*gpu), GpuMode::Whole | GpuMode::Passthrough) {
                return Err(format!(
                    "GPU {gpu} held whole in {} mode",
                    n.mode(*gpu).name()
                ));
            }
        }
    }
    Ok(())
}

#[derive(Clone, Debug)]
enum Op {
    Partition(u32, u8, Vec<(usize, u8)>, bool),
    Submit(u8, u8, u32),
    BindMig(usize, u32, usize, u8),
    BindShared(usize, u32),
    BindWhole(usize, u32),
    Finish(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            0u32..3,
            0u8..4,
            proptest::collection::vec((0usize..7, 0u8..8), 0..6),
            any::<bool>()
        )
            .prop_map(|(g, m, l, i)| Op::Partition(
                g,
                m,
                if m == 1 { l } else { vec![] },
                i
            )),
        (0u8..3, 0u8..7, 1u32..70).prop_map(|(k, p, x)| Op::Submit(k, p, x)),
        (0usize..20, 0u32..3, 0usize..7, 0u8..8).prop_map(|(j, g, p, st)| Op::BindMig(j, g, p, st)),
        (0usize..20, 0u32..3).prop_map(|(j, g)| Op::BindShared(j, g)),
        (0usize..20, 0u32..3).prop_map(|(j, g)| Op::BindWhole(j, g)),
        (0usize..20).prop_map(Op::Finish),
    ]
}

proptest! {
    /// Random mixes of partition changes, submissions, (often wrong) binds and finishes:
    /// no MIG instance is held twice or outside the layout in force, no shared GPU's memory or
    /// compute is over-committed, no GPU is held whole and sliced, every layout in force obeys
    /// the model's rules, and a rejected partition change changes nothing.
    #[test]
    fn partition_invariants_hold(ops in proptest::collection::vec(op(), 1..80)) {
        let mut s = cluster();
        let profiles = mig::model("A100-80GB").expect("mig").profiles;
        let mut jobs: Vec<u64> = Vec::new();
        for op in ops {
            let pick = |i: usize| (!jobs.is_empty()).then(|| jobs[i % jobs.len()]);
            match op {
                Op::Partition(gpu, mode, items, if_idle) => {
                    let mode = [GpuMode::Whole, GpuMode::Mig, GpuMode::Shared, GpuMode::Passthrough][usize::from(mode)];
                    let mig = items.iter().map(|(p, st)| Instance { profile: profiles[*p].name.into(), start: *st }).collect();
                    let before = s.clone();
                    if let ApplyResult::Rejected { .. } = s.apply(&at(set(gpu, mode, mig, if_idle))) {
                        prop_assert_eq!(&s, &before);
                    }
                }
                Op::Submit(kind, p, x) => {
                    let slice = match kind {
                        0 => None,
                        1 => mig_req(profiles[usize::from(p)].name),
                        _ => shared_req(u64::from(x % 30 + 1) * 1024, x),
                    };
                    jobs.push(submit(&mut s, spec(1, slice)));
                }
                Op::BindMig(j, gpu, p, start) => if let Some(job) = pick(j) {
                    apply_slice(&mut s, job, gpu, mig(profiles[p].name, start));
                },
                Op::BindShared(j, gpu) => if let Some(job) = pick(j) {
                    let slice = match &s.jobs[&job].spec.slice {
                        Some(SliceRequest::Shared { memory_mib, share }) => Slice::Shared { memory_mib: *memory_mib, share: *share },
                        _ => Slice::Shared { memory_mib: 1024, share: 10 },
                    };
                    apply_slice(&mut s, job, gpu, slice);
                },
                Op::BindWhole(j, gpu) => if let Some(job) = pick(j) {
                    s.apply(&at(Command::BindJobs { binds: vec![Bind { job, node: 1, gpus: vec![gpu] }] }));
                },
                Op::Finish(j) => if let Some(job) = pick(j) && s.jobs[&job].state.is_live() {
                    finish(&mut s, job);
                },
            }
            prop_assert_eq!(check_invariants(&s), Ok(()));
            // A drained GPU has no change left waiting.
            for (gpu, p) in &s.nodes[&1].partitions {
                prop_assert!(p.pending.is_none() || s.nodes[&1].gpu_busy(*gpu), "GPU {} idle with a change waiting", gpu);
            }
        }
    }
}
