//! The internal (agent-to-agent) protocol version, for rolling upgrades. Every `RaftPeer`
//! request carries the range of versions its caller speaks: `x-gpumesh-protocol: <oldest>` and
//! `x-gpumesh-protocol-max: <newest>` (set in `peer_client::with_deadline`). The peer service
//! serves a caller whose range overlaps its own and refuses any other with `FAILED_PRECONDITION`
//! naming both ranges. A request without the headers comes from a build older than them, which
//! spoke version 1 only; a request without the second header speaks just the first (the version
//! 1 build sent one header and served exactly 1, so version 2 agents still reach it).
//!
//! Bump `PROTOCOL_VERSION` when the peer messages (the body of a `RaftMessage`, the Raft
//! payloads, the `Command` encoding) gain something an older build cannot read, and write it
//! only once every member announces the new version (`NodeRecord.protocol`, see
//! `gpu_raft_store::PROTOCOL_2`). Raise `MIN_COMPATIBLE` only when this build can no longer talk
//! to the older one. A mesh is upgraded one agent at a time between overlapping ranges.
//!
//! Every answer of the peer service names the build that gave it (`x-gpumesh-build`,
//! `build_info::BUILD`), so the leader knows each member's build from its Raft replies and
//! `gpuctl cluster members` shows version skew during a rolling upgrade. It is response
//! metadata, never replicated state: no protocol version gates it, and an older build, which
//! does not send it, is shown as unknown.

use std::ops::RangeInclusive;

use tonic::Request;
use tonic::metadata::MetadataValue;

/// The metadata key of the oldest version the caller speaks (gRPC keys are lower case).
pub const HEADER: &str = "x-gpumesh-protocol";
/// The metadata key of the newest version the caller speaks.
pub const HEADER_MAX: &str = "x-gpumesh-protocol-max";
/// The response metadata key naming the answering agent's build.
pub const BUILD_HEADER: &str = "x-gpumesh-build";
/// The version this build speaks. 1: the first; 2: `Command::Batch` (the leader's group
/// commit) and GPU partitioning (MIG layouts, slice placements, sliced and vm jobs), which a
/// leader writes only once every member has registered with 2 or more; 3: job accounts, retries
/// of failed runs and the out-of-memory outcome (`gpu_raft_store::PROTOCOL_3`); 4: container
/// jobs and tenants' allowed mounts (`gpu_raft_store::PROTOCOL_4`); 5: token limits and
/// enrolments counted against their join token (`gpu_raft_store::PROTOCOL_5`), and forwarded
/// writes carrying their caller's credential (`CREDENTIALS_FORWARDED`); 6: signed audit heads
/// (`gpu_raft_store::PROTOCOL_6`); 7: the live run's phase (`Command::ReportRunPhase`,
/// `gpu_raft_store::PROTOCOL_7`); 8: CA rotation and the issuer of recorded certificates
/// (`gpu_raft_store::PROTOCOL_8`); 9: exactly-once writes (`LogEntry::request`,
/// `gpu_raft_store::PROTOCOL_9`); 10: retention (`Command::Archive`, `gpu_raft_store::PROTOCOL_10`);
/// 11: job dependencies, singletons and holds (`gpu_raft_store::PROTOCOL_11`).
/// 12: updates and requeues of jobs, holds at submission (`gpu_raft_store::PROTOCOL_12`).
/// 13: the learned queue order (`gpu_raft_store::PROTOCOL_13`).
/// 14: the gang starvation guard (`gpu_raft_store::PROTOCOL_14`).
/// 15: conservative backfill (`gpu_raft_store::PROTOCOL_15`).
/// 16: MessagePack Raft messages, forwarded writes and snapshots (`gpu_raft_store::PROTOCOL_16`).
pub const PROTOCOL_VERSION: u32 = 16;
const _: () = assert!(PROTOCOL_VERSION >= gpu_raft_store::PROTOCOL_16);
/// The first version whose agents forward their callers' credentials with their writes.
pub const CREDENTIALS_FORWARDED: u32 = 5;
/// The oldest version this build still speaks with a peer.
pub const MIN_COMPATIBLE: u32 = 1;
/// What a request without the headers speaks.
const BEFORE_THE_HEADER: u32 = 1;

/// Why a peer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Incompatible {
    #[error(
        "incompatible gpumesh peer protocol: the caller speaks versions {}, this agent \
         speaks {MIN_COMPATIBLE}..={PROTOCOL_VERSION}; upgrade agents one at a time between \
         compatible versions (docs/operations.md)",
        show(.theirs)
    )]
    Version { theirs: RangeInclusive<u32> },
    #[error("unreadable {HEADER} header {0:?}; this agent speaks protocol {PROTOCOL_VERSION}")]
    Unreadable(String),
}

fn show(r: &RangeInclusive<u32>) -> String {
    if r.start() == r.end() {
        r.start().to_string()
    } else {
        format!("{}..={}", r.start(), r.end())
    }
}

/// The pure decision on a caller's header values (`None`: absent): the version both speak,
/// the newest in common.
pub fn negotiate(oldest: Option<&str>, newest: Option<&str>) -> Result<u32, Incompatible> {
    let parse = |text: &str| {
        text.trim()
            .parse::<u32>()
            .map_err(|_| Incompatible::Unreadable(text.chars().take(32).collect()))
    };
    let low = oldest.map_or(Ok(BEFORE_THE_HEADER), parse)?;
    let high = newest.map_or(Ok(low), parse)?.max(low);
    let common = low.max(MIN_COMPATIBLE)..=high.min(PROTOCOL_VERSION);
    if common.is_empty() {
        Err(Incompatible::Version { theirs: low..=high })
    } else {
        Ok(*common.end())
    }
}

/// Mark an outgoing peer request with the versions we speak.
pub fn stamp<T>(req: &mut Request<T>) {
    let metadata = req.metadata_mut();
    metadata.insert(HEADER, MetadataValue::from(MIN_COMPATIBLE));
    metadata.insert(HEADER_MAX, MetadataValue::from(PROTOCOL_VERSION));
}

/// Mark an answer of the peer service with this agent's build.
pub fn stamp_build<T>(resp: &mut tonic::Response<T>) {
    resp.metadata_mut().insert(
        BUILD_HEADER,
        MetadataValue::from_static(crate::build_info::BUILD),
    );
}

/// The build a peer's answer names, if it names one that reads as text.
pub fn build_of<T>(resp: &tonic::Response<T>) -> Option<&str> {
    resp.metadata().get(BUILD_HEADER)?.to_str().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_negotiated() {
        assert_eq!(
            negotiate(None, None),
            Ok(1),
            "a build from before the header"
        );
        assert_eq!(negotiate(Some("1"), None), Ok(1), "the version 1 build");
        assert_eq!(negotiate(Some("1"), Some("2")), Ok(2), "this build");
        assert_eq!(
            negotiate(Some("2"), Some("99")),
            Ok(PROTOCOL_VERSION),
            "a newer build that still speaks ours"
        );
        let newer = PROTOCOL_VERSION + 1;
        let err = negotiate(Some(&newer.to_string()), Some("99"))
            .expect_err("newer only: refused")
            .to_string();
        assert!(
            err.contains(&format!("caller speaks versions {newer}..=99")),
            "{err}"
        );
        assert!(
            err.contains(&format!("this agent speaks 1..={PROTOCOL_VERSION}")),
            "{err}"
        );
        assert_eq!(
            negotiate(Some("0"), None),
            Err(Incompatible::Version { theirs: 0..=0 })
        );
        for junk in ["", "one", "-1", "99999999999"] {
            assert!(
                matches!(
                    negotiate(Some(junk), None),
                    Err(Incompatible::Unreadable(_))
                ),
                "{junk}"
            );
            assert!(
                matches!(
                    negotiate(Some("1"), Some(junk)),
                    Err(Incompatible::Unreadable(_))
                ),
                "{junk}"
            );
        }
    }

    /// What the version 1 build checks: the first header alone, which had to be exactly 1.
    #[test]
    fn a_stamped_request_still_reaches_a_version_1_agent() {
        let mut req = Request::new(());
        stamp(&mut req);
        let first = req
            .metadata()
            .get(HEADER)
            .map(|v| v.to_str().unwrap_or("?"));
        assert_eq!(first, Some("1"));
    }

    #[test]
    fn an_answer_names_its_build() {
        let mut resp = tonic::Response::new(());
        assert_eq!(build_of(&resp), None, "an older build's answer");
        stamp_build(&mut resp);
        assert_eq!(build_of(&resp), Some(crate::build_info::BUILD));
        assert!(
            crate::build_info::BUILD.starts_with(concat!(env!("CARGO_PKG_VERSION"), "+")),
            "{}",
            crate::build_info::BUILD
        );
    }
}
