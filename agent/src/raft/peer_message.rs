//! The body of a `RaftMessage` (a Raft message, a forwarded write, or an answer to one): the
//! value in JSON, or in MessagePack (`packed`, `gpu_raft_store::codec`) for a peer that
//! registered with `PROTOCOL_16` or newer. A peer answers in the encoding it was asked in.

use gpu_proto::internal::v1::RaftMessage;
use gpu_raft_store::codec::{self, CodecError};
use gpu_raft_store::{ClusterState, NodeId, PROTOCOL_16};
use serde::Serialize;
use serde::de::DeserializeOwned;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Encoding {
    Json,
    Packed,
}

impl Encoding {
    /// What `peer` reads: MessagePack once it registered with protocol 16 or newer, else
    /// JSON (as for a peer not registered yet).
    pub(crate) fn for_peer(state: &ClusterState, peer: NodeId) -> Self {
        Self::for_protocol(state.nodes.get(&peer).map_or(0, |n| n.protocol))
    }

    /// What a peer registered with `protocol` reads.
    pub(crate) fn for_protocol(protocol: u32) -> Self {
        if protocol >= PROTOCOL_16 {
            Encoding::Packed
        } else {
            Encoding::Json
        }
    }

    /// The encoding `msg` came in.
    pub(crate) fn of(msg: &RaftMessage) -> Self {
        if msg.packed.is_empty() {
            Encoding::Json
        } else {
            Encoding::Packed
        }
    }
}

/// `value` as a message body in `encoding` (no snapshot bytes beside it).
pub(crate) fn pack<T: Serialize>(value: &T, encoding: Encoding) -> Result<RaftMessage, CodecError> {
    let mut msg = RaftMessage::default();
    match encoding {
        Encoding::Json => msg.json = serde_json::to_vec(value)?,
        Encoding::Packed => msg.packed = codec::to_vec(value)?,
    }
    Ok(msg)
}

/// The value `msg` carries, in whichever encoding it came.
pub(crate) fn unpack<T: DeserializeOwned>(msg: &RaftMessage) -> Result<T, CodecError> {
    match Encoding::of(msg) {
        Encoding::Json => Ok(serde_json::from_slice(&msg.json)?),
        Encoding::Packed => codec::from_slice(&msg.packed),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use gpu_raft_store::Command;
    use openraft::{Vote, raft::VoteRequest};

    use super::*;

    #[test]
    fn a_vote_travels_in_either_encoding_and_is_read_as_it_came() {
        let vote = VoteRequest::<NodeId>::new(Vote::new(4, 2), None);
        for encoding in [Encoding::Json, Encoding::Packed] {
            let msg = pack(&vote, encoding).expect("packs");
            assert_eq!(Encoding::of(&msg), encoding);
            assert!(
                msg.json.is_empty() != msg.packed.is_empty(),
                "exactly one body"
            );
            assert_eq!(unpack::<VoteRequest<NodeId>>(&msg).expect("unpacks"), vote);
        }
        let garbage = RaftMessage {
            packed: vec![0xc1],
            ..RaftMessage::default()
        };
        assert!(unpack::<VoteRequest<NodeId>>(&garbage).is_err());
    }

    #[test]
    fn only_peers_registered_with_protocol_16_get_message_pack() {
        let mut state = ClusterState::default();
        for (node, protocol) in [(1, PROTOCOL_16), (2, PROTOCOL_16 - 1)] {
            let register = Command::RegisterNode {
                node,
                addr: format!("127.0.0.1:{}", 7000 + node),
                labels: BTreeMap::new(),
                inventory: Default::default(),
                edge: None,
                protocol,
            };
            state.apply(&gpu_raft_store::LogEntry {
                proposed_at_ms: 1,
                cmd: register,
                meta: None,
                request: None,
            });
        }
        let encodings: Vec<Encoding> = (1..=3).map(|n| Encoding::for_peer(&state, n)).collect();
        assert_eq!(
            encodings,
            [Encoding::Packed, Encoding::Json, Encoding::Json],
            "registered with 16, with 15, not registered"
        );
    }
}
