//! `gpuctl job logs`: copy the job's output stream to stdout chunk by chunk, as it arrives.
//!
//! If the agent serving the stream goes away mid-way, the stream is reopened through the
//! endpoint list at the stream offset already reached, so nothing is repeated or lost. Output
//! the node no longer keeps (rotated away at `jobs.log_max`) is skipped with a note on stderr.

use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;

use super::{Answer, Ctx, Failure};
use crate::client::{self, CallError};
use crate::output;

/// Reopen attempts in a row that deliver nothing before giving up.
const MAX_FRUITLESS_REOPENS: u32 = 3;

pub(super) async fn run(
    ctx: &Ctx,
    job_id: u64,
    follow: bool,
    stderr: bool,
) -> Result<Answer, Failure> {
    let stream = if stderr {
        pb::LogStream::Stderr
    } else {
        pb::LogStream::Stdout
    } as i32;
    let mut offset = 0u64;
    let mut fruitless = 0;
    loop {
        let req = pb::JobLogsRequest {
            job_id,
            stream,
            follow,
            offset,
        };
        let mut chunks = ctx
            .endpoints
            .call(
                |ch| async move { Ok(JobServiceClient::new(ch).job_logs(req).await?.into_inner()) },
            )
            .await?;
        loop {
            match chunks.message().await {
                Ok(Some(chunk)) => {
                    if chunk.skipped > 0 {
                        // To stderr: stdout stays the job's output, byte for byte.
                        eprintln!(
                            "gpuctl: {} bytes of output were rotated away on the node (jobs.log_max) and are not shown",
                            chunk.skipped
                        );
                    }
                    output::emit_bytes(&chunk.data);
                    offset = offset
                        .saturating_add(chunk.skipped)
                        .saturating_add(chunk.data.len() as u64);
                    fruitless = 0;
                }
                Ok(None) => return Ok(Answer::ok(String::new())),
                Err(s) if client::is_transport(&s) && fruitless < MAX_FRUITLESS_REOPENS => {
                    fruitless += 1;
                    break;
                }
                Err(s) => return Err(CallError::Status(s).into()),
            }
        }
    }
}
