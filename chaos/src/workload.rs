//! The background workload: workers that submit recording jobs under fresh idempotency keys
//! through rotating agents (retrying a key on another agent when the answer is unknown), and
//! read back the state of what was acknowledged.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpu_proto::v1 as pb;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::client::{Client, Outcome};
use gpu_tests::records;

/// Tries per key before a worker moves on (each on the next agent).
const TRIES_PER_KEY: usize = 3;

/// What a fault needs to submit its own recorded probe jobs: the client, the scenario's key
/// prefix and the directory the jobs record their runs in.
#[derive(Clone, Copy)]
pub struct Load<'a> {
    pub client: &'a Client,
    pub prefix: &'a str,
    pub records: &'a std::path::Path,
}

/// The job every submission runs: 1 or 2 GPUs, records its run, sleeps 0.2 s, enough attempts
/// to survive requeues.
pub fn job_spec(name: &str, gpus: u32, records: &std::path::Path) -> pb::JobSpec {
    pb::JobSpec {
        max_attempts: 10,
        ..gpu_tests::shell_job(name, gpus, &records::script(records, "0.2"))
    }
}

/// Run worker `w` until `stop` is set. Keys are `<prefix>-w<w>-<n>`.
pub async fn worker(
    client: Client,
    w: usize,
    seed: u64,
    prefix: String,
    records: PathBuf,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    let nodes = client.nodes();
    let process = format!("w{w}");
    let deadline = Duration::from_secs(5);
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("{prefix}-w{w}-{n}");
        n += 1;
        let spec = job_spec(&key, rng.random_range(1..=2), &records);
        let first = rng.random_range(0..nodes.len());
        for t in 0..TRIES_PER_KEY {
            let via = nodes[(first + t) % nodes.len()];
            match client
                .submit(&process, via, spec.clone(), &key, deadline)
                .await?
            {
                Outcome::Ok(id) => {
                    let reader = nodes[rng.random_range(0..nodes.len())];
                    client.read(&process, reader, id, deadline).await?;
                    break;
                }
                Outcome::Fail | Outcome::Info => {
                    tokio::time::sleep(Duration::from_millis(rng.random_range(100..300))).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(150..400))).await;
    }
    Ok(())
}
