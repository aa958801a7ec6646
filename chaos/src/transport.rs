//! C11: application-level delay, loss and duplication on the Raft transport (the kernel here
//! has no netem), through each agent's admin-only `InjectNetworkFault` (the scenario's agents
//! run with `raft.fault_injection = true`). First every agent's messages are delayed, lost and
//! duplicated a little, then the leader's are lost three times in four, then everything is healed;
//! each rule's random stream is seeded from the scenario's seed.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_tests::Cluster;
use rand::Rng;
use rand::rngs::StdRng;

use crate::client::Client;
use crate::history::{Phase, Recorder};
use crate::seed::sleep_ms;

/// Deadline of one injection (it writes an audit entry through Raft, under the faults).
const DEADLINE: Duration = Duration::from_secs(10);

/// The config the scenario's agents need (inside `[raft]`).
pub const AGENT_TOML: &str = "fault_injection = true";

async fn set(
    client: &Client,
    nodes: &[u64],
    rule: &pb::InjectNetworkFaultRequest,
    rng: &mut StdRng,
) -> anyhow::Result<()> {
    for &node in nodes {
        let req = pb::InjectNetworkFaultRequest {
            node_id: node,
            seed: rng.random(),
            ..rule.clone()
        };
        client
            .inject_network_fault(node, req, DEADLINE)
            .await
            .map_err(|e| anyhow::anyhow!("transport faults on n{node}: {e}"))?;
    }
    Ok(())
}

fn describe(r: &pb::InjectNetworkFaultRequest) -> String {
    format!(
        "delay {}-{} ms, loss {}‰, duplication {}‰",
        r.delay_min_ms, r.delay_max_ms, r.drop_per_mille, r.duplicate_per_mille
    )
}

/// C11: a lossy, slow, duplicating transport everywhere for 4–6 s, then the leader's messages
/// three quarters lost for 2–3 s, then healed.
pub async fn lossy_transport(
    c: &Cluster,
    rec: &Recorder,
    rng: &mut StdRng,
    client: &Client,
) -> anyhow::Result<()> {
    sleep_ms(rng, 1000, 2000).await;
    let all: Vec<u64> = c.agents.keys().copied().collect();
    let everywhere = pb::InjectNetworkFaultRequest {
        delay_min_ms: 0,
        delay_max_ms: 40,
        drop_per_mille: 100,
        duplicate_per_mille: 150,
        ..Default::default()
    };
    rec.nemesis(
        Phase::Invoke,
        format!("transport faults on {all:?}: {}", describe(&everywhere)),
    )?;
    set(client, &all, &everywhere, rng).await?;
    rec.nemesis(Phase::Ok, format!("transport faults on {all:?}"))?;
    sleep_ms(rng, 4000, 6000).await;

    let leader = c.leader().await;
    let flaky = pb::InjectNetworkFaultRequest {
        delay_min_ms: 20,
        delay_max_ms: 80,
        drop_per_mille: 750,
        duplicate_per_mille: 100,
        ..Default::default()
    };
    rec.nemesis(
        Phase::Invoke,
        format!("transport faults on leader n{leader}: {}", describe(&flaky)),
    )?;
    set(client, &[leader], &flaky, rng).await?;
    rec.nemesis(Phase::Ok, format!("transport faults on leader n{leader}"))?;
    sleep_ms(rng, 2000, 3000).await;

    rec.nemesis(Phase::Invoke, format!("heal transport faults on {all:?}"))?;
    set(client, &all, &pb::InjectNetworkFaultRequest::default(), rng).await?;
    rec.nemesis(Phase::Info, "healed transport faults".into())?;
    Ok(())
}
