//! `gpuctl gpu partition NODE/GPU --mode mig --layout 3g.40gb,2g.20gb,...`: one
//! `SetGpuPartition` call; the answer is the GPU as the cluster now records it.
//!
//! The server checks the layout against the GPU model's MIG rules and refuses with the reason
//! (unknown profile, overlapping or unplaceable instances, a model without MIG); a busy GPU keeps
//! its partition, drains, and shows the requested one as pending until its jobs end.
//!
//! JSON (stable): the GPU object of `gpu list` without `node_id` and `telemetry`.

use gpu_proto::v1 as pb;
use gpu_proto::v1::gpu_service_client::GpuServiceClient;
use serde_json::Value;

use super::gpu_view::{gpu_json, partition_cell};
use super::{Answer, Ctx, Failure};
use crate::cli::GpuModeArg;

pub(super) async fn run(
    ctx: &Ctx,
    (node_id, gpu_index): (u64, u32),
    mode: GpuModeArg,
    layout: Vec<String>,
) -> Result<Answer, Failure> {
    let req = request(node_id, gpu_index, mode, layout).map_err(Failure::Usage)?;
    let gpu = ctx
        .call(GpuServiceClient::new, req, async |mut c, r| {
            c.set_gpu_partition(r).await
        })
        .await?;
    if !gpu.pending_partition.is_empty() {
        eprintln!(
            "n{node_id}/{gpu_index} is busy: it drains and becomes {} when its jobs end",
            gpu.pending_partition
        );
    }
    Ok(ctx.answer(
        || Value::Object(gpu_json(&gpu)),
        || format!("n{node_id}/{gpu_index} {}\n", partition_cell(&gpu)),
    ))
}

/// The request the flags describe; a layout outside MIG mode is a usage error here (the server
/// refuses it too).
fn request(
    node_id: u64,
    gpu_index: u32,
    mode: GpuModeArg,
    layout: Vec<String>,
) -> Result<pb::SetGpuPartitionRequest, String> {
    if mode == GpuModeArg::Mig && layout.is_empty() {
        return Err("--mode mig needs --layout, e.g. --layout 3g.40gb,2g.20gb,1g.10gb".into());
    }
    if mode != GpuModeArg::Mig && !layout.is_empty() {
        return Err(format!("--layout is for --mode mig, not {}", mode.name()));
    }
    Ok(pb::SetGpuPartitionRequest {
        node_id,
        gpu_index,
        mode: mode.name().into(),
        mig: layout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_become_the_request() {
        let layout = vec!["3g.40gb".to_owned(), "1g.10gb@6".to_owned()];
        let req = request(2, 1, GpuModeArg::Mig, layout.clone()).expect("valid");
        assert_eq!(
            (req.node_id, req.gpu_index, req.mode.as_str()),
            (2, 1, "mig")
        );
        assert_eq!(req.mig, layout);
        let req = request(2, 1, GpuModeArg::Passthrough, vec![]).expect("valid");
        assert_eq!(req.mode, "passthrough");
    }

    #[test]
    fn a_layout_belongs_to_mig_mode_only() {
        let err = request(1, 0, GpuModeArg::Mig, vec![]).expect_err("no layout");
        assert!(err.contains("--layout"), "{err}");
        let err = request(1, 0, GpuModeArg::Shared, vec!["1g.10gb".into()]).expect_err("layout");
        assert!(err.contains("not shared"), "{err}");
    }
}
