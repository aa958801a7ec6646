//! Streaming a run's log file from this node: what is there now, then (with `follow`) new
//! output as it is written, until the job has finished and the file is drained.

use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use gpu_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tonic::Status;

use crate::executor::job_dir::JobDir;
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
                Ok(data) if !data.is_empty() => {
                    c.offset += data.len() as u64;
                    return Some((Ok(pb::LogChunk { data }), c));
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

async fn read_chunk(path: &Path, offset: u64) -> std::io::Result<Vec<u8>> {
    let mut file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    file.seek(std::io::SeekFrom::Start(offset)).await?;
    let mut buf = vec![0; CHUNK];
    let n = file.read(&mut buf).await?;
    buf.truncate(n);
    Ok(buf)
}

/// The placement is still live (its output may grow).
fn still_running(c: &Cursor) -> bool {
    c.cluster.state.read(|s| {
        s.jobs
            .get(&c.job)
            .is_some_and(|j| j.state.is_live() && j.generation == c.generation)
    })
}
