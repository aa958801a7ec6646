//! Partition faults (nft rules cut a node off from every other agent; clients in the root
//! namespace still reach it). C5, the leader isolated: while it is cut off, a prober submits
//! through the majority and reads each acknowledged job back through the old leader, and
//! submits through the old leader itself: the minority must acknowledge nothing and serve no
//! read (the `minority` and `job-order` checkers judge the history). C10 by partition: the
//! agent holding the most running jobs is cut off until its runs are placed again (the
//! `fencing` and `gpu-overlap` checkers judge the runs). Each heals its cut.

use std::time::{Duration, Instant};

use gpu_tests::Cluster;
use rand::Rng;
use rand::rngs::StdRng;

use crate::client::Outcome;
use crate::holder;
use crate::partition::{Cut, Partitioned};
use crate::seed::sleep_ms;
use crate::workload::{Load, job_spec};

/// Deadline of the prober's requests to the old leader (they are expected to time out).
const MINORITY_DEADLINE: Duration = Duration::from_secs(1);
/// Jobs acknowledged by the majority and then read through the old leader, per scenario.
const PROBES: usize = 3;
/// The cut lasts at most this long, however few probes got through.
const PROBE_AT_MOST: Duration = Duration::from_secs(20);

/// C5: isolate the leader for 3–5 s and until `PROBES` jobs acknowledged by the majority were
/// read through the old leader (at most `PROBE_AT_MOST`), then heal.
pub async fn isolate_leader(
    c: &Cluster,
    net: &Partitioned<'_>,
    rng: &mut StdRng,
    load: Load<'_>,
) -> anyhow::Result<()> {
    sleep_ms(rng, 1000, 2000).await;
    let old = c.leader().await;
    cut_minority(c, net, rng, load, &[old]).await
}

/// Cut `minority` off from the other agents for 3–5 s and until `PROBES` jobs acknowledged by
/// the majority were read through the minority (at most `PROBE_AT_MOST`), submitting through
/// the minority as well; then heal. C5 and C6.
pub async fn cut_minority(
    c: &Cluster,
    net: &Partitioned<'_>,
    rng: &mut StdRng,
    Load {
        client,
        prefix,
        records,
    }: Load<'_>,
    minority: &[u64],
) -> anyhow::Result<()> {
    let majority: Vec<u64> = net
        .all
        .iter()
        .copied()
        .filter(|n| !minority.contains(n))
        .collect();
    let leader = c.leader().await;
    net.cut(
        &Cut::split(minority, &majority),
        format!("cut off {minority:?} (leader n{leader}) from {majority:?}"),
        format!("cut off {minority:?}"),
        minority.to_vec(),
    )?;
    let started = Instant::now();
    let at_least = Duration::from_millis(rng.random_range(3000..5000));
    let (mut k, mut probed) = (0, 0);
    while started.elapsed() < PROBE_AT_MOST && (probed < PROBES || started.elapsed() < at_least) {
        let key = format!("{prefix}-probe-{k}");
        let via = majority[k % majority.len()];
        let cut_off = minority[k % minority.len()];
        k += 1;
        let spec = job_spec(&key, 1, records);
        if let Outcome::Ok(id) = client
            .submit("probe", via, spec, &key, Duration::from_secs(3))
            .await?
        {
            client
                .read("probe-old", cut_off, id, MINORITY_DEADLINE)
                .await?;
            probed += 1;
        }
        let key = format!("{prefix}-minority-{k}");
        let spec = job_spec(&key, 1, records);
        client
            .submit("probe-old", cut_off, spec, &key, MINORITY_DEADLINE)
            .await?;
    }
    net.heal(
        format!("heal the cut of {minority:?}"),
        format!("healed the cut of {minority:?}"),
    )
}

/// C10 by partition: submit long recording jobs, cut off the node running the most of them
/// until every one of its runs has been placed again elsewhere, then heal.
pub async fn isolate_holder(
    c: &Cluster,
    net: &Partitioned<'_>,
    rng: &mut StdRng,
    load: Load<'_>,
) -> anyhow::Result<()> {
    sleep_ms(rng, 500, 1500).await;
    let (victim, runs) = holder::long_jobs_holder(c, load).await?;
    net.cut(
        &Cut::isolate(victim, &net.all),
        format!("isolate n{victim} holding runs (job, generation) {runs:?}"),
        format!("isolated n{victim}"),
        vec![victim],
    )?;
    let replaced = holder::wait_replaced(c, victim, &runs).await;
    net.heal(
        format!("heal n{victim}"),
        format!("healed the cut of n{victim}"),
    )?;
    replaced
}
