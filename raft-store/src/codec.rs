//! The binary encoding of what agents store and send: MessagePack with named fields
//! (`rmp-serde`). It holds the Raft log and the log store's records on disk (data format 3),
//! the Raft messages and forwarded writes between agents of protocol 16, and the snapshots of
//! meshes whose members all speak protocol 16.
//!
//! Named, not positional: records grow by optional fields that are left out while they hold
//! their default, which keeps older agents reading them and the state's digest unchanged; a
//! positional encoding cannot leave a field out. Against JSON it is about a quarter smaller
//! and decodes about twice as fast (`gpu-bench codec`, docs/benchmarks.md).
//!
//! JSON stays where bytes are hashed or read by people: the state digest, the audit chain and
//! request stamps, the snapshot file's header line, backups, and the history archive.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The first internal protocol whose agents read MessagePack: Raft messages and forwarded
/// writes (`RaftMessage.packed`) and snapshot payloads. An agent sends it only to a peer that
/// registered with this version or newer, and builds a packed snapshot only once every member
/// has.
pub const PROTOCOL_16: u32 = 16;

/// Why bytes did not decode, or a value did not encode.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("MessagePack: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    #[error("MessagePack: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// `value` in MessagePack.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    Ok(rmp_serde::to_vec_named(value)?)
}

/// A value from its MessagePack.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    Ok(rmp_serde::from_slice(bytes)?)
}

/// A value from its MessagePack or from the JSON that builds before protocol 16 and data
/// format 3 wrote. JSON text begins with an ASCII byte; the MessagePack of a record (a map, an
/// array, a string or nil) never does.
pub fn from_either<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    if is_json(bytes) {
        Ok(serde_json::from_slice(bytes)?)
    } else {
        from_slice(bytes)
    }
}

/// Whether `bytes` are JSON text rather than the MessagePack of a record.
pub fn is_json(bytes: &[u8]) -> bool {
    bytes.first().is_some_and(u8::is_ascii)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Record {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
        by_id: BTreeMap<u64, u32>,
        #[serde(default)]
        added_later: u32,
    }

    fn record() -> Record {
        Record {
            name: "train".into(),
            note: None,
            by_id: BTreeMap::from([(7, 1), (9, 2)]),
            added_later: 3,
        }
    }

    #[test]
    fn a_record_round_trips_and_reads_from_either_encoding() {
        let packed = to_vec(&record()).expect("encodes");
        let json = serde_json::to_vec(&record()).expect("json");
        assert!(packed.len() < json.len(), "{packed:?}");
        assert!(!is_json(&packed) && is_json(&json));
        assert_eq!(from_slice::<Record>(&packed).expect("decodes"), record());
        assert_eq!(from_either::<Record>(&packed).expect("packed"), record());
        assert_eq!(from_either::<Record>(&json).expect("json"), record());
        assert!(!is_json(&to_vec(&None::<u64>).expect("nil")));
        assert!(is_json(b"null"));
    }

    #[test]
    fn a_field_left_out_or_added_later_still_reads() {
        // What an older build wrote: no `note` (skipped), no `added_later` (unknown to it).
        #[derive(Serialize)]
        struct Older {
            name: String,
            by_id: BTreeMap<u64, u32>,
        }
        let older = to_vec(&Older {
            name: "train".into(),
            by_id: BTreeMap::new(),
        })
        .expect("encodes");
        let read: Record = from_slice(&older).expect("decodes");
        assert_eq!((read.note, read.added_later), (None, 0));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bytes in [
            &b""[..],
            b"\xc1",
            b"\x81\xa4name",
            b"{\"name\":",
            b"\xde\xff\xff",
        ] {
            assert!(from_either::<Record>(bytes).is_err(), "{bytes:?}");
        }
    }
}
