//! Demand-driven MIG re-slicing, decided by the leader after a pass: pending MIG jobs that
//! found no free instance get one carved on an idle MIG-capable GPU (one in MIG mode first;
//! a whole GPU only while no whole-GPU job waits), and an idle MIG GPU no waiting MIG job
//! can use goes back to whole when whole-GPU jobs wait. Only idle GPUs are ever re-sliced
//! (no live job holds the GPU or a slice of it, and the pass just planned placed nothing on
//! it); the change is proposed with `if_idle`, so `apply` refuses it if a job got there
//! first. Pure: no clock, no I/O.

use std::collections::BTreeSet;

use gpu_raft_store::mig::{self, Instance};
use gpu_raft_store::{ClusterState, GpuMode, JobId, JobSpec, NodeId, PartitionSpec, SliceRequest};

use super::Plan;
use super::pending::{Class, PendingIndex};
use super::placement::selector_matches;
use super::slices::is_sliced;

/// One proposed change: GPU `gpu` of `node` to `partition`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reslice {
    pub node: NodeId,
    pub gpu: u32,
    pub partition: PartitionSpec,
}

/// The re-slicing the queue (`pending`, indexed from `state`) asks for after `pass`.
pub fn reslice(state: &ClusterState, pass: &Plan, pending: &PendingIndex) -> Vec<Reslice> {
    let used: BTreeSet<(NodeId, u32)> = pass
        .binds
        .iter()
        .flat_map(|b| b.gpus.iter().map(move |g| (b.node, *g)))
        .chain(pass.slice_binds.iter().map(|b| (b.node, b.gpu)))
        .collect();
    // Idle GPUs that may be re-sliced: MIG mode first, then whole ones.
    let mut idle: Vec<(NodeId, u32, GpuMode)> = Vec::new();
    for n in state.nodes.values().filter(|n| n.accepts_work()) {
        for g in &n.inventory.gpus {
            let mode = n.mode(g.index);
            if n.gpu_usable(g)
                && !n.gpu_busy(g.index)
                && !used.contains(&(n.id, g.index))
                && mig::model(&g.model).is_some()
                && matches!(mode, GpuMode::Mig | GpuMode::Whole)
            {
                idle.push((n.id, g.index, mode));
            }
        }
    }
    if idle.is_empty() {
        return Vec::new();
    }
    let placed: BTreeSet<u64> = pass
        .binds
        .iter()
        .map(|b| b.job)
        .chain(pass.slice_binds.iter().map(|b| b.job))
        .collect();
    let waits = |c: &Class| c.members.iter().any(|(_, id)| !placed.contains(id));
    let whole_waits = pending
        .classes()
        .any(|(_, c)| !is_sliced(&c.spec) && c.spec.gpus > 0 && waits(c));
    // Every waiting MIG job, in arrival order.
    let mut mig_wait: Vec<(JobId, &JobSpec, &str)> = pending
        .classes()
        .filter_map(|(_, c)| match &c.spec.slice {
            Some(SliceRequest::Mig { profile }) => Some((c, profile.as_str())),
            _ => None,
        })
        .flat_map(|(c, profile)| {
            c.members
                .iter()
                .filter(|(_, id)| !placed.contains(id))
                .map(move |&(_, id)| (id, &c.spec, profile))
        })
        .collect();
    mig_wait.sort_unstable_by_key(|(id, _, _)| *id);
    idle.sort_by_key(|(n, g, mode)| (*mode != GpuMode::Mig, *n, *g));
    let mut out = Vec::new();
    for (node_id, index, mode) in idle {
        let n = &state.nodes[&node_id];
        let Some(g) = n.gpu(index) else { continue };
        let Some(model) = mig::model(&g.model) else {
            continue;
        };
        let labels = n.effective_labels();
        if mode == GpuMode::Whole && whole_waits {
            continue;
        }
        // Carve the waiting profiles this GPU can serve, in queue order, while they fit.
        let mut layout: Vec<Instance> = Vec::new();
        mig_wait.retain(|(_, spec, profile)| {
            let serves = (spec.gpu_types.is_empty() || spec.gpu_types.contains(&g.gpu_type))
                && selector_matches(spec, &labels);
            match model.fit(&layout, profile).filter(|_| serves) {
                Some(start) => {
                    layout.push(Instance {
                        profile: (*profile).to_owned(),
                        start,
                    });
                    false
                }
                None => true,
            }
        });
        let want = if !layout.is_empty() {
            PartitionSpec {
                mode: GpuMode::Mig,
                mig: layout,
            }
        } else if mode == GpuMode::Mig && whole_waits {
            PartitionSpec::default()
        } else {
            continue;
        };
        if want != n.partition(index) {
            out.push(Reslice {
                node: node_id,
                gpu: index,
                partition: want,
            });
        }
    }
    out
}
