//! How a snapshot chunk travels: its bytes beside the request's body (`RaftMessage.data`), not
//! inside it, where serde writes a `Vec<u8>` as an array of numbers (up to four bytes on the
//! wire per byte of snapshot in JSON, which put a 4 MiB chunk of JSON text right at the 16 MiB
//! message limit). An agent older than `SNAPSHOT_BYTES` reads only the JSON, so it gets the old
//! form; the body is MessagePack for peers of protocol 16 (`peer_message`).

use gpu_proto::internal::v1::RaftMessage;
use gpu_raft_store::TypeConfig;
use gpu_raft_store::codec::CodecError;
use openraft::raft::InstallSnapshotRequest;

use crate::raft::peer_message::{self, Encoding};

/// The first protocol version whose agents read a chunk's bytes from `RaftMessage.data`.
pub(crate) const SNAPSHOT_BYTES: u32 = 6;

type Chunk = InstallSnapshotRequest<TypeConfig>;

/// The message for `chunk`, for a peer that reads `data` (`as_bytes`) or not, with its body in
/// `encoding`.
pub(crate) fn pack(
    mut chunk: Chunk,
    as_bytes: bool,
    encoding: Encoding,
) -> Result<RaftMessage, CodecError> {
    let data = if as_bytes {
        std::mem::take(&mut chunk.data)
    } else {
        Vec::new()
    };
    Ok(RaftMessage {
        data,
        ..peer_message::pack(&chunk, encoding)?
    })
}

/// The chunk a message carries, in any form.
pub(crate) fn unpack(msg: RaftMessage) -> Result<Chunk, String> {
    let mut chunk: Chunk = peer_message::unpack(&msg).map_err(|e| e.to_string())?;
    if !msg.data.is_empty() {
        if !chunk.data.is_empty() {
            return Err("a snapshot chunk with data in both forms".into());
        }
        chunk.data = msg.data;
    }
    Ok(chunk)
}

#[cfg(test)]
mod tests {
    use openraft::{SnapshotMeta, Vote};

    use super::*;

    fn chunk(data: Vec<u8>) -> Chunk {
        InstallSnapshotRequest {
            vote: Vote::new_committed(3, 1),
            meta: SnapshotMeta::default(),
            offset: 8,
            data,
            done: false,
        }
    }

    #[test]
    fn a_chunk_travels_as_bytes_to_new_peers_and_as_json_to_old_ones() {
        // JSON text, as snapshots are: mostly letters, three digits and a comma each in JSON.
        let data: Vec<u8> = br#"{"jobs":{"1":{"spec":{"name":"train"}}}}"#.repeat(1000);
        let as_bytes = pack(chunk(data.clone()), true, Encoding::Json).expect("pack");
        let as_json = pack(chunk(data.clone()), false, Encoding::Json).expect("pack");
        let packed = pack(chunk(data.clone()), true, Encoding::Packed).expect("pack");
        assert!(packed.json.is_empty() && packed.packed.len() < as_bytes.json.len());
        assert_eq!(as_bytes.data, data);
        let (small, big) = (
            as_bytes.json.len() + as_bytes.data.len(),
            as_json.json.len(),
        );
        assert!(
            big > 3 * small,
            "{big} bytes as JSON against {small} as bytes"
        );
        for msg in [as_bytes, as_json, packed] {
            let back = unpack(msg).expect("unpack");
            assert_eq!((back.offset, back.data.len()), (8, data.len()));
            assert_eq!(back.data, data);
        }
        let both = RaftMessage {
            data: vec![1],
            ..pack(chunk(vec![2]), false, Encoding::Json).expect("pack")
        };
        assert!(unpack(both).is_err(), "data in both forms is refused");
    }
}
