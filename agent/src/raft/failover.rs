//! Fast failover. openraft 0.9 lets a follower campaign only after its leader has been silent
//! for the leader lease (`election_timeout_max`) plus a random election timeout, so a killed
//! leader is replaced after 1.5–2 election timeouts. When the leader's port refuses connections,
//! though, its process is gone for certain (the host answers, nothing listens): then a follower
//! campaigns as soon as the voters' lease on that leader has run out, which is the earliest any
//! vote can be granted. The surviving voters stagger by rank (one heartbeat apart) so that they
//! do not split the vote. A leader that is silent for any other reason (a partition, a host that
//! is down or paused) is left to openraft's own timers.
//!
//! Safety does not rest on this: Raft's votes and terms decide who leads, and a premature
//! campaign is refused by voters whose lease has not run out.

use std::time::{Duration, Instant};

use gpu_raft_store::NodeId;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::cluster::Cluster;

/// Past the voters' lease, to absorb the gap between two followers' receipt of one heartbeat.
const MARGIN: Duration = Duration::from_millis(10);

pub(crate) struct FastFailover {
    pub cluster: Cluster,
    pub heartbeat: Duration,
    /// The voters' lease on a leader: openraft's `election_timeout_max`.
    pub lease: Duration,
}

/// A leader this follower has stopped hearing from.
#[derive(Debug, PartialEq, Eq)]
struct Silence {
    leader: NodeId,
    addr: String,
    heard_at: Instant,
    /// This follower's place among the voters other than the leader.
    rank: usize,
}

impl FastFailover {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.heartbeat / 2) => {}
            }
            let Some(silence) = self.silence() else {
                continue;
            };
            if !refuses_connections(&silence.addr, self.heartbeat).await {
                continue;
            }
            let at = campaign_at(silence.heard_at, self.lease, silence.rank, self.heartbeat);
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep_until(at.into()) => {}
            }
            if self.silence().as_ref() != Some(&silence) {
                debug!(
                    leader = silence.leader,
                    "the silence ended before the lease ran out"
                );
                continue;
            }
            info!(
                leader = silence.leader,
                silent_ms = silence.heard_at.elapsed().as_millis() as u64,
                "fast failover: the leader's port refuses connections; campaigning as its lease runs out"
            );
            if self.cluster.raft.trigger().elect().await.is_err() {
                return;
            }
            self.wait_out(&silence, &cancel).await;
        }
    }

    /// The leader this voter has not heard from for two heartbeats, if any.
    fn silence(&self) -> Option<Silence> {
        let heard_at = self.cluster.contacts.leader_heard_at()?;
        if heard_at.elapsed() < self.heartbeat * 2 {
            return None;
        }
        let metrics = self.cluster.raft.metrics().borrow().clone();
        let leader = metrics.current_leader?;
        let membership = metrics.membership_config.membership();
        let addr = membership.get_node(&leader)?.addr.clone();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let rank = rank_among(&voters, leader, self.cluster.id)?;
        Some(Silence {
            leader,
            addr,
            heard_at,
            rank,
        })
    }

    /// One campaign per silence: wait until a leader is heard from or another one is known.
    async fn wait_out(&self, silence: &Silence, cancel: &CancellationToken) {
        while self
            .silence()
            .is_some_and(|s| s.heard_at == silence.heard_at)
        {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.heartbeat) => {}
            }
        }
    }
}

/// `me`'s place among the `voters` other than `leader`; none when `me` is the leader or no voter.
fn rank_among(voters: &[NodeId], leader: NodeId, me: NodeId) -> Option<usize> {
    if me == leader || !voters.contains(&me) {
        return None;
    }
    let mut others: Vec<NodeId> = voters.iter().copied().filter(|v| *v != leader).collect();
    others.sort_unstable();
    others.iter().position(|v| *v == me)
}

/// When the follower of `rank` campaigns: once every voter's lease, counted from about when it
/// heard the leader last, has run out; each rank one heartbeat after the one before.
fn campaign_at(heard_at: Instant, lease: Duration, rank: usize, heartbeat: Duration) -> Instant {
    heard_at + lease + MARGIN + heartbeat * u32::try_from(rank).unwrap_or(u32::MAX)
}

/// Whether `addr` answers a connection attempt with a refusal within `within` (nothing listens
/// there). A timeout or any other error proves nothing.
async fn refuses_connections(addr: &str, within: Duration) -> bool {
    matches!(
        tokio::time::timeout(within, TcpStream::connect(addr)).await,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_followers_campaign_in_rank_order_after_the_lease() {
        assert_eq!(rank_among(&[1, 2, 3], 2, 1), Some(0));
        assert_eq!(rank_among(&[3, 1, 2], 2, 3), Some(1));
        assert_eq!(rank_among(&[1, 2, 3], 2, 2), None, "the leader itself");
        assert_eq!(rank_among(&[1, 2, 3], 2, 4), None, "a learner");
        let t = Instant::now();
        let (lease, hb) = (Duration::from_millis(400), Duration::from_millis(100));
        assert_eq!(campaign_at(t, lease, 0, hb), t + lease + MARGIN);
        assert_eq!(campaign_at(t, lease, 2, hb), t + lease + MARGIN + hb * 2);
    }

    #[tokio::test]
    async fn a_closed_port_refuses_and_an_open_one_does_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let open = listener.local_addr().expect("addr").to_string();
        let within = Duration::from_secs(2);
        assert!(!refuses_connections(&open, within).await);
        drop(listener);
        assert!(refuses_connections(&open, within).await);
    }
}
