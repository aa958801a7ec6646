//! Streaming a run's log from this node: what is there now, then (with `follow`) new output as
//! it is written, until the job has finished and the log is drained. Offsets are stream offsets
//! that hold across log rotation (`executor::log_files`).

use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use gpu_proto::v1 as pb;
use tonic::Status;

use crate::executor::job_dir::JobDir;
use crate::executor::log_files;
use crate::raft::Cluster;

const CHUNK: usize = 64 * 1024;
const POLL: Duration = Duration::from_millis(200);

pub(crate) type LogStream = Pin<Box<dyn Stream<Item = Result<pb::LogChunk, Status>> + Send>>;

struct Cursor {
    path: std::path::PathBuf,
    offset: u64,
    follow: bool,
    job: u64,
    generation: u64,
    cluster: Cluster,
    done: bool,
}

pub(crate) fn stream(
    jobs_dir: &Path,
    cluster: Cluster,
    req: pb::JobLogsRequest,
    generation: u64,
) -> LogStream {
    let dir = JobDir::new(jobs_dir, req.job_id, generation);
    let path = if req.stream == pb::LogStream::Stderr as i32 {
        dir.stderr()
    } else {
        dir.stdout()
    };
    if !dir.path.exists() && !is_live(&cluster, req.job_id, generation) {
        let gone = Status::not_found(format!(
            "no log of j-{} on this node: its run directory was removed (jobs.keep_finished_runs) or never made",
            req.job_id
        ));
        return Box::pin(futures::stream::once(async move { Err(gone) }));
    }
    let cursor = Cursor {
        path,
        offset: req.offset,
        follow: req.follow,
        job: req.job_id,
        generation,
        cluster,
        done: false,
    };
    Box::pin(futures::stream::unfold(cursor, |mut c| async move {
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
    }))
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
