//! `Cluster`: this agent's handle on the Raft group. Writes go to the leader (forwarded when this
//! agent is a follower), linearizable reads confirm a read index with the leader, and joins are
//! admitted by the leader. Every retry loop in the agent's Raft usage lives here.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpu_proto::internal::v1::{JoinRequest, ReadIndexRequest};
use gpu_raft_store::write_trace::{self, Stage};
use gpu_raft_store::{ApplyResult, Command, NodeId, Raft, StateReader};
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, RaftMetrics, ServerState};

use super::contact::ContactBook;
use super::error::{Attempt, ClusterError, remote};
use super::network::NetworkFactory;
use super::peer_client::{PeerClients, with_deadline};
use super::peer_message::{self, Encoding};
use super::proposal::{OnBehalf, Proposal, Written};
use super::proposer::Proposer;

/// A point-in-time view of the Raft group from this agent.
#[derive(Clone, Debug, Default)]
pub struct RaftView {
    pub node_id: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub last_log_index: u64,
    pub voters: BTreeSet<NodeId>,
    pub members: BTreeMap<NodeId, String>,
    /// Per member: matched log index (leader only).
    pub matched: BTreeMap<NodeId, u64>,
    pub is_leader: bool,
    /// Writes proposed on this agent (as leader) since it started, and the log entries they
    /// became: more writes than entries is the group commit at work.
    pub writes_proposed: u64,
    pub entries_proposed: u64,
}

/// What `Cluster` needs to know about this agent and its deployment.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    pub node_id: NodeId,
    /// How long a client-facing operation may keep retrying.
    pub op_timeout: Duration,
    /// How many voters the leader keeps; the rest of the members are learners.
    pub voter_target: usize,
    /// Whether this agent is at an edge site (it asks to join as a learner only).
    pub edge: bool,
    /// The voters' lease on a leader (openraft's `election_timeout_max`): how long after the
    /// leader's last heartbeat a vote for another can be granted.
    pub lease: Duration,
}

#[derive(Clone)]
pub struct Cluster {
    pub id: NodeId,
    pub raft: Raft,
    pub state: StateReader,
    pub peers: PeerClients,
    pub contacts: ContactBook,
    committed: Arc<AtomicU64>,
    /// The group commit every write proposed on this node goes through.
    proposer: Proposer,
    /// How long a client-facing operation may keep retrying.
    op_timeout: Duration,
    voter_target: usize,
    /// Whether this agent is at an edge site (it asks to join as a learner only).
    edge: bool,
    pub(crate) lease: Duration,
    /// Members this leader admitted as edge learners, before their registration (which
    /// records it in the replicated state) has been applied.
    edge_joiners: Arc<std::sync::Mutex<BTreeSet<NodeId>>>,
}

impl Cluster {
    pub fn new(
        raft: Raft,
        state: StateReader,
        committed: Arc<AtomicU64>,
        network: &NetworkFactory,
        settings: ClusterSettings,
    ) -> Self {
        Self {
            id: settings.node_id,
            proposer: Proposer::spawn(raft.clone(), state.clone()),
            raft,
            state,
            peers: network.peers.clone(),
            contacts: network.contacts.clone(),
            committed,
            op_timeout: settings.op_timeout,
            voter_target: settings.voter_target,
            edge: settings.edge,
            lease: settings.lease,
            edge_joiners: Arc::default(),
        }
    }

    /// Why `node` may never be a voter, if it may not: it is at an edge site (by its
    /// registration in the replicated state, or by its join request to this leader when it
    /// has not registered yet), or its join token made it a learner.
    pub fn learner_only(&self, node: NodeId) -> Option<String> {
        self.state.read(|s| s.learner_only(node)).or_else(|| {
            self.edge_joiners
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&node)
                .then(|| "is at an edge site (not yet registered)".to_owned())
        })
    }

    /// Refuse a membership change that would make a learner-only member a voter: whoever asks
    /// (the join path, the autopilot, an operator), this is the one gate every change passes.
    fn refuse_learner_voters(
        &self,
        change: &ChangeMembers<NodeId, BasicNode>,
    ) -> Result<(), ClusterError> {
        refuse_learner_voters(&self.view().voters, change, |id| self.learner_only(id))
    }

    pub fn voter_target(&self) -> usize {
        self.voter_target
    }

    pub fn metrics(&self) -> RaftMetrics<NodeId, BasicNode> {
        self.raft.metrics().borrow().clone()
    }

    pub fn view(&self) -> RaftView {
        let m = self.metrics();
        let membership = m.membership_config.membership();
        let (writes_proposed, entries_proposed) = self.proposer.counts();
        RaftView {
            node_id: self.id,
            leader: m.current_leader,
            term: m.current_term,
            commit_index: self.committed.load(Ordering::Relaxed),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            last_log_index: m.last_log_index.unwrap_or(0),
            voters: membership.voter_ids().collect(),
            members: membership
                .nodes()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect(),
            matched: m
                .replication
                .as_ref()
                .map(|r| {
                    r.iter()
                        .map(|(id, l)| (*id, l.map_or(0, |l| l.index)))
                        .collect()
                })
                .unwrap_or_default(),
            is_leader: m.state == ServerState::Leader,
            writes_proposed,
            entries_proposed,
        }
    }

    /// The oldest internal protocol any member of the current configuration registered with
    /// (0 while one has not registered): what a write may use.
    pub fn lowest_protocol(&self) -> u32 {
        super::proposer::lowest_member_protocol(&self.raft, &self.state)
    }

    /// The current leader and its address, if known.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let leader = m.current_leader?;
        let addr = m
            .membership_config
            .membership()
            .get_node(&leader)?
            .addr
            .clone();
        Some((leader, addr))
    }

    /// Replicate `cmd`; forwarded to the leader from a follower. Returns once the command is
    /// committed and applied on this replica too (read-your-writes through any agent). A
    /// rejection by `apply` is an error.
    pub async fn write(&self, cmd: Command) -> Result<ApplyResult, ClusterError> {
        self.write_as(cmd, None).await
    }

    /// `write` on behalf of an API caller: its `meta` becomes the command's audit entry, and
    /// its credential goes with the write to the leader, which checks it again.
    pub async fn write_as(
        &self,
        cmd: Command,
        by: Option<OnBehalf>,
    ) -> Result<ApplyResult, ClusterError> {
        write_trace::stamp(Stage::WriteIn, 0);
        let (meta, credential) = by.map_or((None, None), |b| (Some(b.meta), b.credential));
        let proposal = Proposal {
            cmd,
            meta,
            credential,
        };
        let written = self
            .retrying(|| async {
                match self.leader() {
                    None => Err(Attempt::Retry(ClusterError::NoLeader)),
                    Some((leader, _)) if leader == self.id => {
                        self.write_as_leader(proposal.clone()).await
                    }
                    Some((leader, addr)) => {
                        self.until_leader_moves(
                            leader,
                            self.forward_write(leader, &addr, &proposal),
                        )
                        .await
                    }
                }
            })
            .await?;
        self.raft
            .wait(Some(self.op_timeout))
            .applied_index_at_least(Some(written.index), "read your write")
            .await
            .map_err(|_| ClusterError::Timeout(self.op_timeout))?;
        write_trace::stamp(Stage::WriteOut, written.index);
        match written.result {
            ApplyResult::Rejected { reason } => Err(ClusterError::Rejected(reason)),
            other => Ok(other),
        }
    }

    /// Propose on this node, which must be the leader (through its group commit, which stamps
    /// the entry's time).
    pub async fn write_as_leader(&self, proposal: Proposal) -> Result<Written, Attempt> {
        self.proposer.propose(proposal).await
    }

    async fn forward_write(
        &self,
        leader: NodeId,
        addr: &str,
        proposal: &Proposal,
    ) -> Result<Written, Attempt> {
        let encoding = self.state.read(|s| Encoding::for_peer(s, leader));
        let msg = peer_message::pack(proposal, encoding)
            .map_err(|e| Attempt::Fail(ClusterError::Raft(e.to_string())))?;
        let mut client = self.peers.get(addr).map_err(remote)?;
        let reply = client
            .propose(with_deadline(msg, self.op_timeout))
            .await
            .map_err(remote)?;
        peer_message::unpack(reply.get_ref())
            .map_err(|e| Attempt::Fail(ClusterError::Raft(format!("bad reply from leader: {e}"))))
    }

    /// Wait until this replica has applied everything committed before the call (read-index).
    pub async fn linearizable_read(&self) -> Result<(), ClusterError> {
        let read_index = self
            .retrying(|| async {
                match self.leader() {
                    None => Err(Attempt::Retry(ClusterError::NoLeader)),
                    Some((leader, _)) if leader == self.id => self.read_index_as_leader().await,
                    Some((leader, addr)) => {
                        let ask = async {
                            let mut client = self.peers.get(&addr).map_err(remote)?;
                            let reply = client
                                .read_index(with_deadline(ReadIndexRequest {}, self.op_timeout))
                                .await
                                .map_err(remote)?;
                            Ok(reply.into_inner().read_index)
                        };
                        self.until_leader_moves(leader, ask).await
                    }
                }
            })
            .await?;
        self.raft
            .wait(Some(self.op_timeout))
            .applied_index_at_least(Some(read_index), "linearizable read")
            .await
            .map_err(|_| ClusterError::Timeout(self.op_timeout))?;
        Ok(())
    }

    /// Confirm leadership with a quorum; the returned index is safe to read at once applied.
    ///
    /// The index is this leader's last log index, not openraft's read index (its committed index
    /// or its first entry of the term). A leader that restarts keeps its term and comes back as
    /// leader with the committed index it last *flushed* (`save_committed` does not fsync), so
    /// openraft's read index can sit below a write it acknowledged before the crash: a read
    /// right after a full restart missed that write (CI, `mesh.rs`). Every acknowledged write is
    /// in the leader's log, and everything in it commits while the leader holds its term.
    pub async fn read_index_as_leader(&self) -> Result<u64, Attempt> {
        let last_log = self.raft.metrics().borrow().last_log_index.unwrap_or(0);
        match self.raft.ensure_linearizable().await {
            Ok(log_id) => Ok(log_id.map_or(0, |l| l.index).max(last_log)),
            Err(RaftError::APIError(_)) => Err(Attempt::Retry(ClusterError::NoLeader)),
            Err(e) => Err(Attempt::Fail(ClusterError::Raft(e.to_string()))),
        }
    }

    /// Ask the cluster (through any member) to admit `node` at `addr`. Returns whether it is a voter.
    /// (`node` is this agent: an edge agent asks to be a learner only.)
    pub async fn join_via(
        &self,
        seeds: &[String],
        node: NodeId,
        addr: &str,
        timeout: Duration,
    ) -> Result<bool, ClusterError> {
        let mut i = 0usize;
        let edge = self.edge;
        retry_until(timeout, || {
            i += 1;
            let seed = seeds[i % seeds.len()].clone();
            async move { self.send_join(&seed, node, addr, edge).await }
        })
        .await
    }

    /// Handle a join request that reached this agent: admit it here if leader, else forward.
    /// An `edge` agent is admitted as a learner only.
    pub async fn join(&self, node: NodeId, addr: String, edge: bool) -> Result<bool, ClusterError> {
        self.retrying(|| async {
            match self.leader() {
                None => Err(Attempt::Retry(ClusterError::NoLeader)),
                Some((leader, _)) if leader == self.id => self.admit(node, &addr, edge).await,
                Some((_, leader_addr)) => self.send_join(&leader_addr, node, &addr, edge).await,
            }
        })
        .await
    }

    /// Ask the agent at `to` to admit `node` (reachable at `addr`); returns whether it is a voter.
    async fn send_join(
        &self,
        to: &str,
        node: NodeId,
        addr: &str,
        edge: bool,
    ) -> Result<bool, Attempt> {
        let mut client = self.peers.get(to).map_err(remote)?;
        let req = JoinRequest {
            node_id: node,
            addr: addr.to_owned(),
            edge,
        };
        let reply = client
            .join(with_deadline(req, self.op_timeout))
            .await
            .map_err(remote)?;
        Ok(reply.into_inner().voter)
    }

    /// Leader side of a join: add as learner (waiting for it to catch up), then fill voter seats.
    async fn admit(&self, node: NodeId, addr: &str, edge: bool) -> Result<bool, Attempt> {
        if edge {
            self.edge_joiners
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(node);
        }
        let known = self.view().members.get(&node).cloned();
        let change = match known {
            Some(a) if a == addr => None,
            Some(_) => Some(ChangeMembers::SetNodes(BTreeMap::from([(
                node,
                BasicNode::new(addr),
            )]))),
            None => Some(ChangeMembers::AddNodes(BTreeMap::from([(
                node,
                BasicNode::new(addr),
            )]))),
        };
        if let Some(change) = change {
            tracing::info!(node_id = node, addr, "admitting member");
            self.change_membership(change, true).await?;
            // Let the new learner catch up before it can be counted on as a voter.
            let target = self.view().last_log_index;
            let caught_up = self
                .raft
                .wait(Some(self.op_timeout))
                .metrics(
                    |m| {
                        m.replication
                            .as_ref()
                            .and_then(|r| r.get(&node).copied().flatten())
                            .map(|l| l.index)
                            >= Some(target)
                    },
                    "learner caught up",
                )
                .await;
            if caught_up.is_err() {
                return Err(Attempt::Retry(ClusterError::Timeout(self.op_timeout)));
            }
        }
        let view = self.view();
        if !view.voters.contains(&node)
            && view.voters.len() < self.voter_target
            && self.learner_only(node).is_none()
        {
            tracing::info!(node_id = node, "promoting learner to voter");
            self.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([node])), true)
                .await?;
        }
        Ok(self.view().voters.contains(&node))
    }

    /// Commit a membership change on this node (the leader), then record it in the audit log
    /// (best effort: the change stands if the record fails, which is logged).
    pub async fn change_membership(
        &self,
        change: ChangeMembers<NodeId, BasicNode>,
        retain: bool,
    ) -> Result<(), Attempt> {
        self.refuse_learner_voters(&change).map_err(Attempt::Fail)?;
        let audit = super::membership_audit::record(self.id, &change);
        match self.raft.change_membership(change, retain).await {
            Ok(_) => {
                if let Err(Attempt::Retry(e) | Attempt::Fail(e)) = self.write_as_leader(audit).await
                {
                    tracing::warn!(error = %e, "could not record a membership change in the audit log");
                }
                Ok(())
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                Err(Attempt::Retry(ClusterError::NoLeader))
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                ChangeMembershipError::InProgress(e),
            ))) => Err(Attempt::Retry(ClusterError::Raft(e.to_string()))),
            Err(e) => Err(Attempt::Fail(ClusterError::Raft(e.to_string()))),
        }
    }

    /// Run `call`, made to `leader`, unless this agent learns of another leader first: then give
    /// it up as retryable, so the loop moves to the new leader instead of waiting on one that
    /// may be cut off for the whole deadline. A given-up forwarded write may still have been
    /// applied: at-least-once, like any retry after a dropped connection (see `remote`).
    async fn until_leader_moves<T>(
        &self,
        leader: NodeId,
        call: impl Future<Output = Result<T, Attempt>>,
    ) -> Result<T, Attempt> {
        let mut metrics = self.raft.metrics();
        let moved = async {
            if metrics
                .wait_for(|m| m.current_leader.is_some_and(|l| l != leader))
                .await
                .is_err()
            {
                // Raft is shutting down: the call decides.
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            result = call => result,
            _ = moved => Err(Attempt::Retry(ClusterError::NoLeader)),
        }
    }

    /// Run `attempt` until it succeeds, fails for good, or the operation deadline passes.
    async fn retrying<T, F, Fut>(&self, attempt: F) -> Result<T, ClusterError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Attempt>>,
    {
        // A backoff ends early once a new leader is known: after a failover the next try goes
        // out as soon as the election is over, not when a doubled backoff happens to end.
        let metrics = self.raft.metrics();
        retry_until_woken(self.op_timeout, attempt, || new_leader(metrics.clone())).await
    }
}

/// Completes once a leader other than the one known at the call is known.
fn new_leader(
    mut metrics: tokio::sync::watch::Receiver<RaftMetrics<NodeId, BasicNode>>,
) -> impl Future<Output = ()> {
    let before = metrics.borrow().current_leader;
    async move {
        let moved = metrics.wait_for(|m| m.current_leader.is_some() && m.current_leader != before);
        if moved.await.is_err() {
            // Raft is shutting down: the backoff decides.
            std::future::pending::<()>().await;
        }
    }
}

/// Run `attempt` until it succeeds, fails for good, or `timeout` passes; back off exponentially
/// (20 ms doubling to 1 s) between tries. On timeout the last retryable error is returned.
pub async fn retry_until<T, F, Fut>(timeout: Duration, attempt: F) -> Result<T, ClusterError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Attempt>>,
{
    retry_until_woken(timeout, attempt, std::future::pending::<()>).await
}

/// `retry_until`, where a backoff also ends when `wake()` completes.
async fn retry_until_woken<T, F, Fut, W, WFut>(
    timeout: Duration,
    mut attempt: F,
    mut wake: W,
) -> Result<T, ClusterError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Attempt>>,
    W: FnMut() -> WFut,
    WFut: Future<Output = ()>,
{
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(20);
    loop {
        let woken = wake();
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(Attempt::Fail(e)) => return Err(e),
            Err(Attempt::Retry(e)) if Instant::now() + backoff >= deadline => return Err(e),
            Err(Attempt::Retry(_)) => {
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = woken => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// The pure rule of `Cluster::refuse_learner_voters`: no member that `learner_only` bars joins
/// the voters `current`. (A barred voter already there stays until the autopilot replaces it.)
fn refuse_learner_voters(
    current: &BTreeSet<NodeId>,
    change: &ChangeMembers<NodeId, BasicNode>,
    learner_only: impl Fn(NodeId) -> Option<String>,
) -> Result<(), ClusterError> {
    let added: Vec<NodeId> = match change {
        ChangeMembers::AddVoterIds(ids) | ChangeMembers::ReplaceAllVoters(ids) => ids
            .iter()
            .copied()
            .filter(|id| !current.contains(id))
            .collect(),
        ChangeMembers::AddVoters(nodes) => nodes
            .keys()
            .copied()
            .filter(|id| !current.contains(id))
            .collect(),
        _ => Vec::new(),
    };
    for node in added {
        if let Some(why) = learner_only(node) {
            return Err(ClusterError::LearnerOnly { node, why });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_membership_change_makes_an_edge_member_a_voter() {
        let current = BTreeSet::from([1, 2, 3]);
        let learner_only = |id: NodeId| (id == 4).then(|| "is at edge site \"edge-1\"".to_owned());
        let refused = |change| refuse_learner_voters(&current, &change, learner_only);
        let err = refused(ChangeMembers::AddVoterIds(BTreeSet::from([4]))).expect_err("edge");
        assert_eq!(
            err.to_string(),
            "n4 is at edge site \"edge-1\": it is a learner only and never becomes a voter"
        );
        assert!(refused(ChangeMembers::ReplaceAllVoters(BTreeSet::from([1, 2, 4]))).is_err());
        assert!(
            refused(ChangeMembers::AddVoters(BTreeMap::from([(
                4,
                BasicNode::new("h:1")
            )])))
            .is_err()
        );
        // Plain members may be promoted; an edge member may join as a learner.
        assert!(refused(ChangeMembers::AddVoterIds(BTreeSet::from([5]))).is_ok());
        assert!(refused(ChangeMembers::ReplaceAllVoters(BTreeSet::from([1, 2, 5]))).is_ok());
        assert!(
            refused(ChangeMembers::AddNodes(BTreeMap::from([(
                4,
                BasicNode::new("h:1")
            )])))
            .is_ok()
        );
        // Replacing the voters of a cluster whose voter n4 is edge does not need n4 to leave
        // in the same change (the autopilot removes it once a replacement exists).
        let with_edge_voter = BTreeSet::from([1, 2, 4]);
        assert!(
            refuse_learner_voters(
                &with_edge_voter,
                &ChangeMembers::ReplaceAllVoters(BTreeSet::from([1, 2, 5])),
                learner_only
            )
            .is_ok()
        );
    }
}
