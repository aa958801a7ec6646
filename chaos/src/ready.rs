//! Waiting until every agent has finished starting. An agent serves its API before its join
//! through the seed returns; cutting the seed off in that moment leaves the joining agent
//! retrying until its `join_timeout` and exiting, so partition scenarios wait for every
//! agent's "agent ready" log line first.

use std::time::Duration;

use gpu_tests::Cluster;

/// The line `gpu-agent run` logs once its start-up script is done.
const READY: &str = "agent ready";

/// Wait (up to 30 s) until every running agent's log says it is ready.
pub async fn wait_all_ready(c: &Cluster) {
    c.wait_for(
        "every agent to finish starting",
        Duration::from_secs(30),
        |c| async move {
            c.running().iter().all(|id| {
                std::fs::read_to_string(&c.agents[id].log).is_ok_and(|log| log.contains(READY))
            })
        },
    )
    .await;
}
