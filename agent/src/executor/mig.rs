//! MIG layout reconciliation: each pass makes every local GPU's MIG instances match the layout
//! the replicated state gives it.

use std::collections::HashMap;

use gpu_raft_store::{GpuMode, PartitionSpec};
use tracing::{info, warn};

use super::Executor;

impl Executor {
    /// Make every local GPU's MIG state match the replicated layout (level-triggered: after
    /// an agent restart, or a reboot that cleared MIG, the layout is re-applied). Only
    /// instances no job holds ever differ (`apply` changes a layout only then), so nothing in
    /// use is destroyed. Each failure is logged once until it changes.
    pub(super) fn reconcile_mig(&self, errors: &mut HashMap<u32, String>) {
        for (index, p) in self.wanted_partitions() {
            let want = (p.mode == GpuMode::Mig).then_some(p.mig);
            let have = match self.gpus.mig_devices(index) {
                Ok(h) => h,
                Err(e) => {
                    note_error(
                        errors,
                        index,
                        e.to_string(),
                        "cannot read the GPU's MIG state",
                    );
                    continue;
                }
            };
            let same = match (&want, &have) {
                (None, None) => true,
                (Some(w), Some(h)) => crate::gpu::mig_matches(h, w),
                _ => false,
            };
            if same {
                errors.remove(&index);
                continue;
            }
            match self.gpus.apply_mig(index, want.as_deref()) {
                Ok(devices) => {
                    errors.remove(&index);
                    info!(gpu = index, instances = devices.len(), "MIG layout applied");
                }
                Err(e) => note_error(errors, index, e.to_string(), "cannot apply the MIG layout"),
            }
        }
    }

    /// Each GPU of this node's inventory with the partitioning the replicated state gives it.
    fn wanted_partitions(&self) -> Vec<(u32, PartitionSpec)> {
        let me = self.cluster.id;
        self.cluster.state.read(|s| {
            s.nodes.get(&me).map_or_else(Vec::new, |n| {
                n.inventory
                    .gpus
                    .iter()
                    .map(|g| (g.index, n.partition(g.index)))
                    .collect()
            })
        })
    }
}

/// Record GPU `index`'s latest failure, logging it only when it differs from the last one.
fn note_error(errors: &mut HashMap<u32, String>, index: u32, error: String, what: &str) {
    if errors.insert(index, error.clone()).as_ref() != Some(&error) {
        warn!(gpu = index, error = %error, "{what}");
    }
}
