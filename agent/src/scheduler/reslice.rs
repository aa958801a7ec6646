//! Demand-driven MIG re-slicing, decided by the leader after a pass: pending MIG jobs that
//! found no free instance get one carved on an idle MIG-capable GPU (one in MIG mode first;
//! a whole GPU only while no whole-GPU job waits), and an idle MIG GPU no waiting MIG job
//! can use goes back to whole when whole-GPU jobs wait. Only idle GPUs are ever re-sliced
//! (no live job holds the GPU or a slice of it, and the pass just planned placed nothing on
//! it); the change is proposed with `if_idle`, so `apply` refuses it if a job got there
//! first. Pure: no clock, no I/O.

use std::collections::BTreeSet;

use gpu_raft_store::mig::{self, Instance};
use gpu_raft_store::{
    ClusterState, GpuMode, JobSpec, JobState, NodeId, PartitionSpec, SliceRequest,
};

use super::Plan;
use super::placement::selector_matches;
use super::slices::is_sliced;

/// One proposed change: GPU `gpu` of `node` to `partition`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reslice {
    pub node: NodeId,
    pub gpu: u32,
    pub partition: PartitionSpec,
}

/// The re-slicing the queue asks for after `pass` (planned on `state`).
pub fn reslice(state: &ClusterState, pass: &Plan) -> Vec<Reslice> {
    let placed: BTreeSet<u64> = pass
        .binds
        .iter()
        .map(|b| b.job)
        .chain(pass.slice_binds.iter().map(|b| b.job))
        .collect();
    let used: BTreeSet<(NodeId, u32)> = pass
        .binds
        .iter()
        .flat_map(|b| b.gpus.iter().map(move |g| (b.node, *g)))
        .chain(pass.slice_binds.iter().map(|b| (b.node, b.gpu)))
        .collect();
    let waiting: Vec<&JobSpec> = state
        .jobs
        .values()
        .filter(|j| j.state == JobState::Pending && !placed.contains(&j.id))
        .map(|j| &j.spec)
        .collect();
    let mut mig_wait: Vec<(&JobSpec, &str)> = waiting
        .iter()
        .filter_map(|s| match &s.slice {
            Some(SliceRequest::Mig { profile }) => Some((*s, profile.as_str())),
            _ => None,
        })
        .collect();
    let whole_waits = waiting.iter().any(|s| !is_sliced(s) && s.gpus > 0);
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
        mig_wait.retain(|(spec, profile)| {
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
