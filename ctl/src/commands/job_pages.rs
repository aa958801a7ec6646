//! Every page of a `ListJobs` answer: the server answers at most a page at a time
//! (`ListJobsResponse.next_after_id` says where the next one starts).

use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;

use super::Ctx;
use crate::client::CallError;

/// The jobs (or folded lines) `req` asks for, page after page, at most `req.limit` of them
/// (0: all).
pub(super) async fn list_all(
    ctx: &Ctx,
    mut req: pb::ListJobsRequest,
) -> Result<Vec<pb::Job>, CallError> {
    let limit = req.limit as usize;
    let mut jobs = Vec::new();
    loop {
        let page = ctx
            .call(JobServiceClient::new, req.clone(), async |mut c, r| {
                c.list_jobs(r).await
            })
            .await?;
        jobs.extend(page.jobs);
        match page.next_after_id {
            Some(after) if limit == 0 || jobs.len() < limit => {
                req.after_id = after;
                if limit > 0 {
                    req.limit = (limit - jobs.len()) as u32;
                }
            }
            _ => return Ok(jobs),
        }
    }
}
