//! `gpuctl debug inject`: faults for clusters on the simulated GPU backend.
//!
//! JSON (stable): `{"node_id", "gpu_index", "fault"}` with `fault` as typed
//! (`overheat`, `ecc`, `lost`, `clear`, `xid:N`).

use gpu_proto::v1 as pb;
use gpu_proto::v1::gpu_service_client::GpuServiceClient;
use serde_json::json;

use super::{Answer, Ctx, Failure};
use crate::args::Fault;
use crate::cli::DebugVerb;

pub(crate) async fn run(ctx: &Ctx, verb: DebugVerb) -> Result<Answer, Failure> {
    let DebugVerb::Inject { node, gpu, fault } = verb;
    let req = inject_request(node, gpu, fault);
    ctx.call(GpuServiceClient::new, req, async |mut c, r| {
        c.inject_fault(r).await
    })
    .await?;
    Ok(ctx.answer(
        || json!({ "node_id": node, "gpu_index": gpu, "fault": fault.to_string() }),
        || format!("injected {fault} into n{node}/{gpu}\n"),
    ))
}

fn inject_request(node_id: u64, gpu_index: u32, fault: Fault) -> pb::InjectFaultRequest {
    let (kind, xid) = match fault {
        Fault::Overheat => (pb::GpuFault::Overheat, 0),
        Fault::Ecc => (pb::GpuFault::Ecc, 0),
        Fault::Lost => (pb::GpuFault::Lost, 0),
        Fault::Clear => (pb::GpuFault::Clear, 0),
        Fault::Xid(code) => (pb::GpuFault::Xid, code),
    };
    pb::InjectFaultRequest {
        node_id,
        gpu_index,
        fault: kind as i32,
        xid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_map_to_requests() {
        let req = inject_request(3, 1, Fault::Xid(79));
        assert_eq!(
            (req.node_id, req.gpu_index, req.fault, req.xid),
            (3, 1, pb::GpuFault::Xid as i32, 79)
        );
        assert_eq!(
            inject_request(3, 1, Fault::Clear).fault,
            pb::GpuFault::Clear as i32
        );
    }
}
