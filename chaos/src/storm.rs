//! C16 client retry storm: each idempotency key is submitted concurrently by several tasks,
//! each through a different agent, with short random deadlines, retrying until acknowledged.
//! C17 storms keyless submissions the same way, each key sent as the request id of every try.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::client::{Client, Keyed, Outcome};
use crate::workload::job_spec;

/// Tries per task before it gives up on its key.
const TRIES: usize = 40;

/// Storm keys one after another, `tasks` concurrent submitters per key, until `stop` is set
/// and at least `min_keys` keys are done. Keys are `<prefix>-storm-<k>`, and the job's name,
/// sent as `keyed` says.
#[allow(clippy::too_many_arguments)]
pub async fn storm(
    client: Client,
    min_keys: usize,
    tasks: usize,
    keyed: Keyed,
    stop: Arc<AtomicBool>,
    seed: u64,
    prefix: String,
    records: PathBuf,
) -> anyhow::Result<()> {
    let nodes = client.nodes();
    let mut k = 0usize;
    while k < min_keys || !stop.load(Ordering::Relaxed) {
        let key = format!("{prefix}-storm-{k}");
        let spec = job_spec(&key, 1, &records);
        let mut set = tokio::task::JoinSet::new();
        for t in 0..tasks {
            let client = client.clone();
            let (key, spec) = (key.clone(), spec.clone());
            let via = nodes[t % nodes.len()];
            let mut rng = StdRng::seed_from_u64(seed ^ ((k as u64) << 16) ^ t as u64);
            set.spawn(async move {
                let process = format!("storm-{k}-{t}");
                for _ in 0..TRIES {
                    let deadline = Duration::from_millis(rng.random_range(20..300));
                    let outcome = client
                        .submit_keyed(&process, via, spec.clone(), &key, keyed, deadline)
                        .await?;
                    if let Outcome::Ok(_) = outcome {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(rng.random_range(0..50))).await;
                }
                anyhow::Ok(())
            });
        }
        while let Some(r) = set.join_next().await {
            r??;
        }
        k += 1;
    }
    Ok(())
}
