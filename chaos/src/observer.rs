//! The observer: samples every agent's own view of the leader (its term and the leader it
//! knows) a few times a second and records each answer as a `status` event, for the
//! one-leader-per-term check. Agents that do not answer in time are skipped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::client::Client;
use crate::history::{Event, OpKind, Phase};

const PROCESS: &str = "observer";
const EVERY: Duration = Duration::from_millis(200);
const DEADLINE: Duration = Duration::from_millis(500);

/// Sample until `stop` is set.
pub async fn observe(client: Client, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    while !stop.load(Ordering::Relaxed) {
        for via in client.nodes() {
            if let Ok(s) = client.own_status(via, DEADLINE).await {
                client.recorder().record(Event {
                    via: Some(via),
                    term: Some(s.term),
                    leader: s.leader_id,
                    ..Event::new(PROCESS, Phase::Ok, OpKind::Status)
                })?;
            }
        }
        tokio::time::sleep(EVERY).await;
    }
    Ok(())
}
