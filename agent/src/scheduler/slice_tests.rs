//! Slice placement through `plan` and `apply`: MIG instances, shared slices and pass-through
//! GPUs beside whole-GPU jobs; best fit packs; the leader's re-slicing touches only idle GPUs;
//! and random mixes never over-commit.

use gpu_raft_store::mig::{self, Instance};
use gpu_raft_store::partition::FULL_SHARE;
use gpu_raft_store::{
    ApplyResult, ClusterState, Command, GpuMode, GpuRecord, JobKind, JobSpec, JobState, Outcome,
    PartitionSpec, Slice, SliceRequest,
};
use proptest::prelude::*;

use super::plan::plan_default;
use super::testkit::{apply, node, spec, submit};
use super::{Ordering, PendingIndex, Plan, Policy, plan, reslice};
use crate::scheduler::PlanEnv;

fn a100(index: u32) -> GpuRecord {
    GpuRecord {
        index,
        uuid: format!("GPU-{index}"),
        model: "A100-80GB".into(),
        gpu_type: "A100".into(),
        memory_mib: 81_920,
        numa_node: Some(0),
        nvlink_peers: vec![],
        healthy: true,
    }
}

fn partition(s: &mut ClusterState, node: u64, gpu: u32, mode: GpuMode, mig: &[&str]) {
    let m = mig::model("A100-80GB").expect("mig");
    let mig = m
        .parse_layout(&mig.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>())
        .expect("layout");
    let r = apply(
        s,
        Command::SetGpuPartition {
            node,
            gpu,
            partition: PartitionSpec { mode, mig },
            if_idle: false,
        },
    );
    assert_eq!(r, ApplyResult::Ok);
}

fn mig_job(profile: &str) -> JobSpec {
    JobSpec {
        slice: Some(SliceRequest::Mig {
            profile: profile.into(),
        }),
        ..spec(1, 0)
    }
}

fn shared_job(memory_mib: u64, share: u32) -> JobSpec {
    JobSpec {
        slice: Some(SliceRequest::Shared { memory_mib, share }),
        ..spec(1, 0)
    }
}

/// Apply a plan's binds and slice binds; every one must be accepted.
fn apply_plan(s: &mut ClusterState, p: &Plan) {
    for cmd in [
        Command::BindJobs {
            binds: p.binds.clone(),
        },
        Command::BindSlices {
            binds: p.slice_binds.clone(),
        },
    ] {
        let ApplyResult::Bound { rejected, .. } = apply(s, cmd) else {
            panic!("bind result");
        };
        assert!(rejected.is_empty(), "a fresh plan must apply: {rejected:?}");
    }
}

#[test]
fn mixed_queue_gets_whole_mig_and_shared_gpus() {
    let mut s = ClusterState::new();
    node(&mut s, 1, (0..4).map(a100).collect());
    partition(&mut s, 1, 0, GpuMode::Mig, &["3g.40gb", "3g.40gb"]);
    partition(&mut s, 1, 1, GpuMode::Shared, &[]);
    partition(&mut s, 1, 3, GpuMode::Passthrough, &[]);
    submit(&mut s, mig_job("3g.40gb"));
    submit(&mut s, shared_job(40_960, 50));
    submit(&mut s, spec(1, 0));
    submit(&mut s, shared_job(40_960, 50));
    submit(&mut s, mig_job("3g.40gb"));
    submit(
        &mut s,
        JobSpec {
            kind: JobKind::Vm,
            ..spec(1, 0)
        },
    );
    // Each of these has nowhere to go.
    submit(&mut s, shared_job(1024, 1));
    submit(&mut s, mig_job("1g.10gb"));
    submit(&mut s, spec(1, 0));
    let p = plan_default(&s);
    let slices: Vec<(u64, u32, Slice)> = p
        .slice_binds
        .iter()
        .map(|b| (b.job, b.gpu, b.slice.clone()))
        .collect();
    let mig = |start| Slice::Mig {
        profile: "3g.40gb".into(),
        start,
    };
    let share = Slice::Shared {
        memory_mib: 40_960,
        share: 50,
    };
    assert_eq!(
        slices,
        vec![
            (1, 0, mig(0)),
            (2, 1, share.clone()),
            (4, 1, share),
            (5, 0, mig(4)),
        ]
    );
    let whole: Vec<(u64, Vec<u32>)> = p.binds.iter().map(|b| (b.job, b.gpus.clone())).collect();
    assert_eq!(whole, vec![(3, vec![2]), (6, vec![3])]);
    let reasons: std::collections::BTreeMap<u64, String> =
        p.unschedulable.iter().cloned().collect();
    assert_eq!(reasons[&7], "waiting for 1024 MiB and 1% of a shared GPU");
    assert_eq!(reasons[&8], "waiting for a free MIG instance 1g.10gb");
    assert_eq!(reasons[&9], "waiting for 1 GPU to be free");
    apply_plan(&mut s, &p);
}

#[test]
fn a_shared_request_no_shared_gpu_can_hold_says_so() {
    let mut s = ClusterState::new();
    let t4 = GpuRecord {
        model: "T4-16GB".into(),
        gpu_type: "T4".into(),
        memory_mib: 15_360,
        ..a100(1)
    };
    node(&mut s, 1, vec![a100(0), t4]);
    partition(&mut s, 1, 1, GpuMode::Shared, &[]);
    // The A100 could hold 20 GiB, but it is a whole GPU: the shared T4 never can.
    submit(&mut s, shared_job(20_480, 10));
    submit(&mut s, shared_job(10_240, 10));
    submit(&mut s, shared_job(10_240, 10));
    let p = plan_default(&s);
    let reasons: std::collections::BTreeMap<u64, String> =
        p.unschedulable.iter().cloned().collect();
    assert_eq!(
        reasons[&1],
        "no schedulable GPU in shared mode has 20480 MiB (the largest has 15360 MiB)"
    );
    assert_eq!(p.slice_binds.iter().map(|b| b.job).collect::<Vec<_>>(), [2]);
    assert_eq!(reasons[&3], "waiting for 10240 MiB and 10% of a shared GPU");
}

#[test]
fn best_fit_packs_shared_slices_first_fit_spreads() {
    let mut t = ClusterState::new();
    node(&mut t, 1, (0..2).map(a100).collect());
    partition(&mut t, 1, 0, GpuMode::Shared, &[]);
    partition(&mut t, 1, 1, GpuMode::Shared, &[]);
    // 30% already on GPU 1, GPU 0 empty.
    submit(&mut t, shared_job(1024, 30));
    let mut moved = plan_default(&t).slice_binds;
    moved[0].gpu = 1;
    apply(&mut t, Command::BindSlices { binds: moved });
    submit(&mut t, shared_job(1024, 60));
    let best = plan_default(&t);
    assert_eq!(
        best.slice_binds[0].gpu, 1,
        "best fit packs onto the used GPU"
    );
    let policy = Policy {
        slice_best_fit: false,
        ..Policy::default()
    };
    let first_fit = plan(&t, &policy, &PlanEnv::new(1, &policy));
    assert_eq!(
        first_fit.slice_binds[0].gpu, 0,
        "first fit takes the lowest GPU"
    );
}

#[test]
fn reslicing_carves_idle_gpus_only_and_returns_them_whole() {
    let mut s = ClusterState::new();
    node(&mut s, 1, (0..2).map(a100).collect());
    partition(&mut s, 1, 0, GpuMode::Mig, &["7g.80gb"]);
    submit(&mut s, mig_job("7g.80gb"));
    let p = plan_default(&s);
    apply_plan(&mut s, &p);
    // GPU 0 is busy with the 7g job; seven 1g jobs wait. Only the idle whole GPU 1 is carved.
    for _ in 0..7 {
        submit(&mut s, mig_job("1g.10gb"));
    }
    let p = plan_default(&s);
    assert!(p.slice_binds.is_empty());
    let r = reslice(&s, &p, &PendingIndex::of(&s, Ordering::Fcfs));
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!((r[0].node, r[0].gpu), (1, 1));
    let seven: Vec<Instance> = (0..7)
        .map(|start| Instance {
            profile: "1g.10gb".into(),
            start,
        })
        .collect();
    assert_eq!(r[0].partition.mig, seven);
    let ok = apply(
        &mut s,
        Command::SetGpuPartition {
            node: 1,
            gpu: 1,
            partition: r[0].partition.clone(),
            if_idle: true,
        },
    );
    assert_eq!(ok, ApplyResult::Ok);
    let p = plan_default(&s);
    assert_eq!(p.slice_binds.len(), 7);
    apply_plan(&mut s, &p);
    assert!(reslice(&s, &plan_default(&s), &PendingIndex::of(&s, Ordering::Fcfs)).is_empty());
    // A whole-GPU job waits; the 7g job ends: its now idle MIG GPU goes back to whole, and
    // the busy one (GPU 1) is left alone.
    submit(&mut s, spec(1, 0));
    let generation = s.jobs[&1].generation;
    apply(
        &mut s,
        Command::JobFinished {
            job: 1,
            generation,
            outcome: Outcome::Exited { code: 0 },
        },
    );
    let r = reslice(&s, &plan_default(&s), &PendingIndex::of(&s, Ordering::Fcfs));
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!((r[0].gpu, r[0].partition.mode), (0, GpuMode::Whole));
    assert!(
        s.jobs.values().all(|j| !j.evict_requested),
        "re-slicing never stops a job"
    );
}

fn check(s: &ClusterState) -> Result<(), String> {
    for n in s.nodes.values() {
        for g in &n.inventory.gpus {
            let holds = n.slices.get(&g.index);
            let (mem, share) = n.shared_used(g.index);
            if mem > g.memory_mib || share > FULL_SHARE {
                return Err(format!("GPU {} over-committed", g.index));
            }
            if holds.is_some_and(|h| !h.is_empty()) && n.allocations.contains_key(&g.index) {
                return Err(format!("GPU {} whole and sliced", g.index));
            }
            let starts = n.mig_held(g.index);
            let unique: std::collections::BTreeSet<u8> = starts.iter().copied().collect();
            if unique.len() != starts.len() {
                return Err(format!("GPU {} MIG instance held twice", g.index));
            }
        }
    }
    Ok(())
}

proptest! {
    /// Random partitioned clusters and mixed queues (whole, MIG, shared, vm), several rounds
    /// of plan → apply → some jobs finish → re-slice: every planned bind applies, no slice is
    /// over-committed, and every job that could run somewhere eventually does.
    #[test]
    fn mixed_plans_apply_and_never_over_commit(
        modes in proptest::collection::vec(0u8..4, 1..5),
        jobs in proptest::collection::vec((0u8..4, 0usize..7, 1u32..101), 1..25),
    ) {
        let mut s = ClusterState::new();
        node(&mut s, 1, (0..modes.len() as u32).map(a100).collect());
        let profiles = mig::model("A100-80GB").expect("mig").profiles;
        for (i, m) in modes.iter().enumerate() {
            let mode = [GpuMode::Whole, GpuMode::Mig, GpuMode::Shared, GpuMode::Passthrough][usize::from(*m)];
            let layout: &[&str] = if mode == GpuMode::Mig { &["3g.40gb", "2g.20gb", "1g.10gb"] } else { &[] };
            partition(&mut s, 1, i as u32, mode, layout);
        }
        for (kind, p, x) in &jobs {
            let spec = match kind {
                0 => spec(1, 0),
                1 => mig_job(profiles[*p].name),
                2 => shared_job(u64::from(*x) * 800, *x),
                _ => JobSpec { kind: JobKind::Vm, ..spec(1, 0) },
            };
            submit(&mut s, spec);
        }
        for round in 0..2 * jobs.len() + 4 {
            let p = plan_default(&s);
            apply_plan(&mut s, &p);
            prop_assert_eq!(check(&s), Ok(()));
            for r in reslice(&s, &p, &PendingIndex::of(&s, Ordering::Fcfs)) {
                apply(&mut s, Command::SetGpuPartition { node: r.node, gpu: r.gpu, partition: r.partition, if_idle: true });
            }
            // Every other round, every live job ends.
            if round % 2 == 1 {
                let live: Vec<(u64, u64)> = s.jobs.values().filter(|j| j.state.is_live()).map(|j| (j.id, j.generation)).collect();
                for (job, generation) in live {
                    apply(&mut s, Command::JobFinished { job, generation, outcome: Outcome::Exited { code: 0 } });
                }
            }
            prop_assert_eq!(check(&s), Ok(()));
        }
        // Whatever is left pending has no GPU in a mode that could ever serve it (re-slicing
        // only moves GPUs between whole and MIG; shared and pass-through are the operator's).
        let n = &s.nodes[&1];
        let has = |m: GpuMode| n.inventory.gpus.iter().any(|g| n.mode(g.index) == m);
        for j in s.jobs.values().filter(|j| j.state == JobState::Pending) {
            let stuck_ok = match (&j.spec.slice, j.spec.kind) {
                (_, JobKind::Vm) => !has(GpuMode::Passthrough),
                (Some(SliceRequest::Shared { .. }), _) => !has(GpuMode::Shared),
                // Whole and MIG jobs need a GPU in whole or MIG mode (re-slicing moves
                // GPUs between the two).
                _ => !has(GpuMode::Whole) && !has(GpuMode::Mig),
            };
            prop_assert!(stuck_ok, "j-{} ({:?}) never ran: {:?}", j.id, j.spec.slice, j.reason);
        }
    }
}
