//! Streaming a run's log from this node: what is there now, then (with `follow`) new output as
//! it is written, until the run has ended and the log is drained. The one place that knows
//! where a run's output lies on disk. Offsets are stream offsets that hold across log rotation
//! (`executor::log_files`).

use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use gpu_proto::v1 as pb;
use gpu_raft_store::JobId;
use tonic::Status;

use crate::executor::job_dir::JobDir;
use crate::executor::log_files;
use crate::raft::Cluster;

const CHUNK: usize = 64 * 1024;
const POLL: Duration = Duration::from_millis(200);

pub(crate) type LogStream = Pin<Box<dyn Stream<Item = Result<pb::LogChunk, Status>> + Send>>;

/// One member's log of one run on this node, as the API and the peer service ask for it.
pub(crate) struct LogRequest {
    pub job: JobId,
    pub generation: u64,
    /// `pb::LogStream` as sent; anything but stderr means stdout.
    pub stream: i32,
    pub follow: bool,
    pub offset: u64,
}

impl LogRequest {
    /// A public request for run `generation` (resolved by `log_target`).
    pub(crate) fn of(req: &pb::JobLogsRequest, generation: u64) -> Self {
        Self {
            job: req.job_id,
            generation,
            stream: req.stream,
            follow: req.follow,
            offset: req.offset,
        }
    }
}

struct Cursor {
    path: std::path::PathBuf,
    offset: u64,
    follow: bool,
    job: JobId,
    generation: u64,
    cluster: Cluster,
    done: bool,
    /// Following: the run was seen ended (one last read follows).
    ended: bool,
}

/// The log as a stream of chunks. `NOT_FOUND` when the run has ended and left no directory
/// here (it never ran on this node, or its directory was removed); while the run is live an
/// absent file is simply empty so far.
pub(crate) fn stream(
    jobs_dir: &Path,
    cluster: Cluster,
    req: LogRequest,
) -> Result<LogStream, Status> {
    let dir = JobDir::new(jobs_dir, req.job, req.generation);
    let path = if req.stream == pb::LogStream::Stderr as i32 {
        dir.stderr()
    } else {
        dir.stdout()
    };
    let cursor = Cursor {
        path,
        offset: req.offset,
        follow: req.follow,
        job: req.job,
        generation: req.generation,
        cluster,
        done: false,
        ended: false,
    };
    if !dir.path.is_dir() && !still_running(&cursor) {
        return Err(Status::not_found(format!(
            "no log of run g{} of job j-{} on node n{}: it did not run here, or its directory was removed (jobs.keep_finished_runs)",
            req.generation, req.job, cursor.cluster.id
        )));
    }
    Ok(Box::pin(futures::stream::unfold(
        cursor,
        |mut c| async move {
            if c.done {
                return None;
            }
            loop {
                match read_chunk(&c.path, c.offset).await {
                    Ok(chunk) if !chunk.data.is_empty() => {
                        c.offset += chunk.skipped + chunk.data.len() as u64;
                        let (data, skipped) = (chunk.data, chunk.skipped);
                        return Some((Ok(pb::LogChunk { data, skipped }), c));
                    }
                    Ok(_) if c.follow && still_running(&c) => tokio::time::sleep(POLL).await,
                    // The run may have written its last output between that read and the check:
                    // read once more after seeing it ended.
                    Ok(_) if c.follow && !c.ended => c.ended = true,
                    Ok(_) => return None,
                    Err(e) => {
                        c.done = true;
                        return Some((
                            Err(Status::internal(format!(
                                "reading {}: {e}",
                                c.path.display()
                            ))),
                            c,
                        ));
                    }
                }
            }
        },
    )))
}

/// Up to `CHUNK` bytes of the stream from `offset`, across its rotated and current files
/// (`log_files`): a reader whose offset was rotated away resumes at the oldest byte kept and is
/// told how much it missed.
async fn read_chunk(path: &Path, offset: u64) -> std::io::Result<log_files::Chunk> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || log_files::read_at(&path, offset, CHUNK))
        .await
        .map_err(std::io::Error::other)?
}

/// The placement is still live (its output may grow).
fn still_running(c: &Cursor) -> bool {
    is_live(&c.cluster, c.job, c.generation)
}

fn is_live(cluster: &Cluster, job: u64, generation: u64) -> bool {
    cluster.state.read(|s| {
        s.jobs
            .get(&job)
            .is_some_and(|j| j.state.is_live() && j.generation == generation)
    })
}
