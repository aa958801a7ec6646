//! Applying nodes: registration (with its edge-site terms), operator labels, cordon and drain,
//! and the leader's liveness verdict (a node gone Down gives up its jobs).

use std::collections::{BTreeMap, BTreeSet};

use crate::model::auth::Seat;
use crate::model::container;
use crate::model::job::Outcome;
use crate::model::node::{EdgeTerms, Inventory, NodeRecord, NodeStatus, SITE_LABEL};
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::state::ClusterState;
use crate::model::validate;
use crate::{JobId, NodeId};

impl ClusterState {
    #[allow(clippy::too_many_arguments)] // The fields of `Command::RegisterNode`, one to one.
    pub(crate) fn register(
        &mut self,
        node: NodeId,
        addr: &str,
        labels: &BTreeMap<String, String>,
        inventory: &Inventory,
        edge: Option<&EdgeTerms>,
        protocol: u32,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        validate::addr(addr).map_err(invalid)?;
        validate::labels(labels).map_err(invalid)?;
        let mut seen = std::collections::BTreeSet::new();
        if !inventory.gpus.iter().all(|g| seen.insert(g.index)) {
            return Err(invalid("duplicate GPU index in inventory".into()));
        }
        self.check_edge_terms(node, labels, edge).map_err(invalid)?;
        if edge.is_none() && self.seats.get(&node) == Some(&Seat::Edge) {
            return Err(invalid(format!(
                "node {node} was enrolled with an edge join token: its agent must run with an \
                 [edge] section"
            )));
        }
        let record = self.nodes.entry(node).or_insert_with(|| NodeRecord {
            id: node,
            addr: String::new(),
            agent_labels: BTreeMap::new(),
            labels: BTreeMap::new(),
            inventory: Default::default(),
            status: NodeStatus::Ready,
            cordoned: false,
            allocations: BTreeMap::new(),
            quarantined: BTreeMap::new(),
            partitions: BTreeMap::new(),
            slices: BTreeMap::new(),
            edge: None,
            protocol,
            images: BTreeSet::new(),
            registered_at_ms: now,
            updated_at_ms: now,
        });
        record.addr = addr.to_owned();
        record.edge = edge.cloned();
        record.protocol = protocol;
        record.agent_labels.clone_from(labels);
        record.inventory.clone_from(inventory);
        record.status = NodeStatus::Ready;
        record.updated_at_ms = now;
        Ok(ApplyResult::Ok)
    }

    /// The images node `node`'s runtime holds, replacing what it reported before. Each must be
    /// a canonical image reference, at most `MAX_NODE_IMAGES` of them.
    pub(crate) fn set_images(
        &mut self,
        node: NodeId,
        images: &BTreeSet<String>,
    ) -> Result<ApplyResult, Rejection> {
        container::node_images(images).map_err(invalid)?;
        let record = self.node_mut(node)?;
        record.images.clone_from(images);
        Ok(ApplyResult::Ok)
    }

    /// Why a registration's edge terms cannot be accepted, if they cannot: they must be valid
    /// and name the node's own `site` label; every node of a site must be edge with the same
    /// terms, or none of them edge (so one site has one grace, whoever leads); and a node's
    /// terms do not change while it holds jobs (their supervisors fence by the old lease).
    pub fn check_edge_terms(
        &self,
        node: NodeId,
        labels: &BTreeMap<String, String>,
        edge: Option<&EdgeTerms>,
    ) -> Result<(), String> {
        let site = labels.get(SITE_LABEL);
        if let Some(terms) = edge {
            terms.validate()?;
            if site != Some(&terms.site) {
                return Err(format!(
                    "edge site {:?} must be the node's `site` label (it is {site:?})",
                    terms.site
                ));
            }
        }
        if let Some(site) = site {
            let peer = self.nodes.values().find(|n| {
                n.id != node
                    && (n.edge.as_ref().is_some_and(|e| &e.site == site)
                        || n.agent_labels.get(SITE_LABEL) == Some(site))
            });
            if let Some(peer) = peer {
                let describe = |t: Option<&EdgeTerms>| match t {
                    Some(t) => format!(
                        "an edge site (lease {} ms, down_after {} ms)",
                        t.lease_ms, t.down_after_ms
                    ),
                    None => "not an edge site".to_owned(),
                };
                if peer.edge.as_ref() != edge {
                    return Err(format!(
                        "site {site:?} is {} for n{}, but n{node} registers it as {}: every \
                         agent of a site needs the same [edge] settings",
                        describe(peer.edge.as_ref()),
                        peer.id,
                        describe(edge)
                    ));
                }
            }
        }
        if let Some(record) = self.nodes.get(&node)
            && record.edge.as_ref() != edge
            && !record.allocations.is_empty()
        {
            return Err(format!(
                "n{node} holds jobs started under its earlier edge settings; drain it before \
                 changing them"
            ));
        }
        Ok(())
    }

    pub(crate) fn set_status(
        &mut self,
        node: NodeId,
        status: NodeStatus,
        requeue_evicting: bool,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let record = self.node_mut(node)?;
        record.status = status;
        record.updated_at_ms = now;
        if status == NodeStatus::Down {
            let live: Vec<(JobId, u64, bool)> = self
                .jobs
                .values()
                .filter(|j| j.state.is_live() && j.on_node(node))
                .map(|j| (j.id, j.generation, j.evict_requested))
                .collect();
            for (job, generation, evicting) in live {
                let outcome = if evicting && requeue_evicting {
                    Outcome::Evicted
                } else {
                    Outcome::Lost {
                        message: format!("node n{node} went down"),
                    }
                };
                self.finished(job, generation, &outcome, now)?;
            }
        }
        Ok(ApplyResult::Ok)
    }

    pub(crate) fn drain(
        &mut self,
        node: NodeId,
        evict: bool,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let record = self.node_mut(node)?;
        record.cordoned = true;
        record.updated_at_ms = now;
        if evict {
            for job in self.jobs.values_mut() {
                if job.state.is_live() && job.on_node(node) {
                    job.evict_requested = true;
                }
            }
        }
        Ok(ApplyResult::Ok)
    }

    /// Why evicting `node`'s jobs would strand them, if it would: it runs live jobs and no
    /// other node could take one (none is Ready, uncordoned and has a GPU).
    pub fn eviction_strands(&self, node: NodeId) -> Option<String> {
        let live = self
            .jobs
            .values()
            .filter(|j| j.state.is_live() && j.on_node(node))
            .count();
        let elsewhere = self.nodes.values().any(|n| {
            n.id != node
                && n.status == NodeStatus::Ready
                && !n.cordoned
                && !n.inventory.gpus.is_empty()
        });
        (live > 0 && !elsewhere).then(|| {
            format!(
                "n{node} is the last schedulable node: its {live} live job(s) would have nowhere \
                 to go. Uncordon or add another node first, or `gpuctl node cordon {node}` to \
                 stop new placements and let them finish (nothing was changed)"
            )
        })
    }

    /// `SetNodeLabels`: the operator's labels after the change must still be valid.
    pub(crate) fn set_labels(
        &mut self,
        node: NodeId,
        set: &BTreeMap<String, String>,
        remove: &BTreeSet<String>,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let n = self.node_mut(node)?;
        let labels = n.labels_after(set, remove);
        validate::labels(&labels).map_err(invalid)?;
        n.labels = labels;
        n.updated_at_ms = now;
        Ok(ApplyResult::Ok)
    }

    pub(crate) fn cordon(
        &mut self,
        node: NodeId,
        cordoned: bool,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let n = self.node_mut(node)?;
        n.cordoned = cordoned;
        n.updated_at_ms = now;
        Ok(ApplyResult::Ok)
    }
}
