//! Failover trials: kill -9 the leader while a client writes through another member; the time
//! from the kill until that client's next acknowledged write.

use std::time::{Duration, Instant};

use crate::stats::Summary;
use crate::target::Crashable;

/// How long one write may take before the client gives up on it and sends the next. It bounds
/// the resolution: etcd holds a write sent to a follower during an election until the
/// client's deadline (at 2 s every etcd trial measured 2.0 s), so a client retries often.
const ATTEMPT_DEADLINE: Duration = Duration::from_millis(250);
/// A trial that sees no acknowledged write for this long fails the benchmark.
const GIVE_UP: Duration = Duration::from_secs(30);

/// The samples of `trials` trials, one per kill.
pub async fn trials<T: Crashable>(target: &mut T, trials: usize) -> anyhow::Result<Summary> {
    let mut samples = Vec::with_capacity(trials);
    for trial in 0..trials {
        let leader = target.leader().await?;
        let writer = (leader + 1) % target.members();
        let mut client = target.connect(writer).await?;
        let mut seq = (1u64 << 62) | ((trial as u64) << 32);
        // A steady trickle first, so the writer's connection and the mesh are warm.
        for _ in 0..20 {
            target.write(&mut client, seq).await?;
            seq += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let killed_at = Instant::now();
        target.kill(leader);
        loop {
            seq += 1;
            let attempt = tokio::time::timeout(ATTEMPT_DEADLINE, target.write(&mut client, seq));
            if let Ok(Ok(())) = attempt.await {
                break;
            }
            anyhow::ensure!(
                killed_at.elapsed() < GIVE_UP,
                "no write acknowledged {GIVE_UP:?} after killing the leader (trial {trial})"
            );
        }
        samples.push(killed_at.elapsed());
        target.restart(leader).await?;
    }
    Ok(Summary::of(&samples))
}
