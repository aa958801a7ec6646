//! Partitions of a whole cluster (agents in network namespaces), timed from the seed and
//! recorded with the nodes each cut leaves on a minority side. C6: the leader and one random
//! follower are split from the other three of five (the `cut_minority` probes check that the
//! two acknowledge and serve nothing). C7: a ring over a seeded order of five, so each agent
//! reaches only its two neighbours and every one sees a different majority. C8: flapping,
//! `rounds` random cuts (one node isolated or, with five, a random two-three split, often
//! with the leader on the small side) each held briefly and healed. Each heals its cuts; `nemesis::heal` follows.

use std::time::Duration;

use gpu_tests::Cluster;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, seq::IndexedRandom};

use crate::isolation::cut_minority;
use crate::partition::{Cut, Partitioned};
use crate::seed::sleep_ms;
use crate::workload::{Load, job_spec};

/// Deadline of the ring prober's submissions.
const RING_DEADLINE: Duration = Duration::from_secs(2);

/// C6: split the leader and a random follower (a minority of two in five) from the rest,
/// probing both sides, then heal.
pub async fn split_leader_side(
    c: &Cluster,
    net: &Partitioned<'_>,
    rng: &mut StdRng,
    load: Load<'_>,
) -> anyhow::Result<()> {
    sleep_ms(rng, 1000, 2000).await;
    let leader = c.leader().await;
    let followers: Vec<u64> = c.agents.keys().copied().filter(|n| *n != leader).collect();
    let with = *followers
        .choose(rng)
        .ok_or_else(|| anyhow::anyhow!("C6 needs more than one agent"))?;
    cut_minority(c, net, rng, load, &[leader, with]).await
}

/// C7: a ring over a seeded order of the agents for 4–6 s while a prober submits through each
/// agent in turn, then heal. Nobody is on a minority side: each agent sees three of five.
pub async fn ring(
    c: &Cluster,
    net: &Partitioned<'_>,
    rng: &mut StdRng,
    Load {
        client,
        prefix,
        records,
    }: Load<'_>,
) -> anyhow::Result<()> {
    sleep_ms(rng, 1000, 2000).await;
    let mut order = net.all.clone();
    order.shuffle(rng);
    let leader = c.leader().await;
    net.cut(
        &Cut::ring(&order),
        format!("ring {order:?} (leader n{leader})"),
        format!("ring {order:?}"),
        Vec::new(),
    )?;
    let hold = Duration::from_millis(rng.random_range(4000..6000));
    let started = std::time::Instant::now();
    let mut k = 0;
    while started.elapsed() < hold {
        let key = format!("{prefix}-ring-{k}");
        let via = order[k % order.len()];
        k += 1;
        let spec = job_spec(&key, 1, records);
        client
            .submit("probe", via, spec, &key, RING_DEADLINE)
            .await?;
        sleep_ms(rng, 100, 300).await;
    }
    net.heal("heal the ring".into(), "healed the ring".into())
}

/// C8: `rounds` times, cut the cluster at random (one agent isolated, or with five agents a
/// random two-three split, half the time; the leader on the cut-off side half the time), hold
/// it 0.4–1.5 s, heal, and let it run 0.3–1.2 s.
pub async fn flapping(
    c: &Cluster,
    net: &Partitioned<'_>,
    rng: &mut StdRng,
    rounds: u32,
) -> anyhow::Result<()> {
    let all = &net.all;
    sleep_ms(rng, 800, 1500).await;
    for round in 0..rounds {
        let mut shuffled = all.clone();
        shuffled.shuffle(rng);
        if rng.random_bool(0.5) {
            // Half the cuts take the leader with them.
            let leader = c.leader().await;
            shuffled.retain(|n| *n != leader);
            shuffled.insert(0, leader);
        }
        let size = if all.len() >= 5 && rng.random_bool(0.5) {
            2
        } else {
            1
        };
        let (minority, majority) = shuffled.split_at(size);
        let mut minority = minority.to_vec();
        minority.sort_unstable();
        net.cut(
            &Cut::split(&minority, majority),
            format!("flap {round}: cut off {minority:?}"),
            format!("flap {round}: cut off {minority:?}"),
            minority.clone(),
        )?;
        sleep_ms(rng, 400, 1500).await;
        net.heal(format!("heal flap {round}"), format!("healed flap {round}"))?;
        sleep_ms(rng, 300, 1200).await;
    }
    Ok(())
}
