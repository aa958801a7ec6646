//! `gpuctl job logs`: copy one output stream of one run of the job (any gang rank, any kept
//! attempt) to stdout chunk by chunk, as it arrives. `gpuctl run` copies both streams of each
//! run with the same code.
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

/// Which log to copy.
#[derive(Clone, Copy, Debug)]
pub(super) struct LogSource {
    pub job_id: u64,
    pub stderr: bool,
    pub follow: bool,
    /// The gang member; `None`: rank 0.
    pub rank: Option<u32>,
    /// The run's attempt number; `None`: the latest run.
    pub attempt: Option<u32>,
}

/// Where the bytes go: `job logs` writes either stream to stdout; `run` writes the job's
/// stderr to its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sink {
    Stdout,
    Stderr,
}

pub(super) async fn run(ctx: &Ctx, source: LogSource) -> Result<Answer, Failure> {
    copy(ctx, source, Sink::Stdout).await?;
    Ok(Answer::ok(String::new()))
}

/// Copy the log to `sink` until the stream ends (with `follow`: until the run has ended and
/// its output is drained).
pub(super) async fn copy(ctx: &Ctx, source: LogSource, sink: Sink) -> Result<(), Failure> {
    let stream = if source.stderr {
        pb::LogStream::Stderr
    } else {
        pb::LogStream::Stdout
    } as i32;
    let mut offset = 0u64;
    let mut fruitless = 0;
    loop {
        let req = pb::JobLogsRequest {
            job_id: source.job_id,
            stream,
            follow: source.follow,
            offset,
            rank: source.rank,
            attempt: source.attempt,
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
                    match sink {
                        Sink::Stdout => output::emit_bytes(&chunk.data),
                        Sink::Stderr => output::emit_err_bytes(&chunk.data),
                    }
                    offset = offset
                        .saturating_add(chunk.skipped)
                        .saturating_add(chunk.data.len() as u64);
                    fruitless = 0;
                }
                Ok(None) => return Ok(()),
                Err(s) if client::is_transport(&s) && fruitless < MAX_FRUITLESS_REOPENS => {
                    fruitless += 1;
                    break;
                }
                Err(s) => return Err(CallError::Status(s).into()),
            }
        }
    }
}
