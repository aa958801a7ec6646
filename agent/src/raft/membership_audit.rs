//! Membership changes in the audit log. A change is Raft's own entry, not a `Command`, so the
//! leader that committed it adds an audit entry after it (`Command::RecordAction` with the
//! change as verb and object, the leader as actor): joins, address changes, promotions,
//! demotions and removals are in the hash chain with every other mutation.

use std::collections::{BTreeMap, BTreeSet};

use gpu_raft_store::{Command, NodeId, RequestMeta};
use openraft::{BasicNode, ChangeMembers};

use super::proposal::Proposal;

/// The audit record of `change`, committed by leader `leader`.
pub(crate) fn record(leader: NodeId, change: &ChangeMembers<NodeId, BasicNode>) -> Proposal {
    let (verb, object) = describe(change);
    Proposal {
        cmd: Command::RecordAction {
            outcome: "ok".into(),
        },
        meta: Some(RequestMeta {
            actor: format!("node/{leader}"),
            verb: verb.into(),
            object,
            request_id: String::new(),
            source: "raft membership".into(),
        }),
        credential: None,
    }
}

fn describe(change: &ChangeMembers<NodeId, BasicNode>) -> (&'static str, String) {
    let ids = |ids: &BTreeSet<NodeId>| {
        let named: Vec<String> = ids.iter().map(|id| format!("node/{id}")).collect();
        named.join(",")
    };
    let nodes = |nodes: &BTreeMap<NodeId, BasicNode>| {
        let named: Vec<String> = nodes
            .iter()
            .map(|(id, n)| format!("node/{id}@{}", n.addr))
            .collect();
        named.join(",")
    };
    match change {
        ChangeMembers::AddNodes(n) => ("member.add", nodes(n)),
        ChangeMembers::SetNodes(n) => ("member.readdress", nodes(n)),
        ChangeMembers::ReplaceAllNodes(n) => ("member.replace_all", nodes(n)),
        ChangeMembers::RemoveNodes(i) => ("member.remove", ids(i)),
        ChangeMembers::AddVoterIds(i) => ("member.promote", ids(i)),
        ChangeMembers::AddVoters(n) => ("member.promote", nodes(n)),
        ChangeMembers::RemoveVoters(i) => ("member.demote", ids(i)),
        ChangeMembers::ReplaceAllVoters(i) => ("member.voters", ids(i)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_recorded_with_its_leader_verb_and_nodes() {
        let add = ChangeMembers::AddNodes(BTreeMap::from([(4, BasicNode::new("h:4"))]));
        let p = record(1, &add);
        let meta = p.meta.expect("audited");
        assert_eq!(
            (
                meta.actor.as_str(),
                meta.verb.as_str(),
                meta.object.as_str()
            ),
            ("node/1", "member.add", "node/4@h:4")
        );
        assert!(p.credential.is_none());
        let demote = ChangeMembers::RemoveVoters(BTreeSet::from([2, 3]));
        let meta = record(1, &demote).meta.expect("audited");
        assert_eq!(
            (meta.verb.as_str(), meta.object.as_str()),
            ("member.demote", "node/2,node/3")
        );
    }
}
