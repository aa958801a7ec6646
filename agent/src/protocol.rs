//! The internal (agent-to-agent) protocol version, for rolling upgrades: every `RaftPeer`
//! request carries `x-gpumesh-protocol: <version>` (set in `peer_client::with_deadline`), and
//! the peer service refuses a caller whose version it cannot speak with `FAILED_PRECONDITION`
//! naming both versions. A request without the header comes from a build older than the header,
//! which spoke version 1.
//!
//! Bump `PROTOCOL_VERSION` when the peer messages (the JSON inside `RaftMessage`, the Raft
//! payloads, the `Command` encoding) change incompatibly; raise `MIN_COMPATIBLE` only when this
//! build can no longer talk to the older one. A mesh is upgraded one agent at a time between
//! versions whose ranges overlap.

use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

/// The metadata key (gRPC metadata keys are lower case).
pub const HEADER: &str = "x-gpumesh-protocol";
/// The version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// The oldest version this build still accepts from a peer.
pub const MIN_COMPATIBLE: u32 = 1;
/// What a request without the header speaks.
const BEFORE_THE_HEADER: u32 = 1;

/// Why a peer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Incompatible {
    #[error(
        "incompatible gpumesh peer protocol: the caller speaks version {theirs}, this agent \
         speaks {PROTOCOL_VERSION} and accepts {MIN_COMPATIBLE}..={PROTOCOL_VERSION}; upgrade \
         agents one at a time between compatible versions (docs/operations.md)"
    )]
    Version { theirs: u32 },
    #[error("unreadable {HEADER} header {0:?}; this agent speaks protocol {PROTOCOL_VERSION}")]
    Unreadable(String),
}

/// The pure decision on a caller's header value (`None`: absent).
pub fn negotiate(header: Option<&str>) -> Result<u32, Incompatible> {
    let theirs = match header {
        None => BEFORE_THE_HEADER,
        Some(text) => text
            .trim()
            .parse::<u32>()
            .map_err(|_| Incompatible::Unreadable(text.chars().take(32).collect()))?,
    };
    if (MIN_COMPATIBLE..=PROTOCOL_VERSION).contains(&theirs) {
        Ok(theirs)
    } else {
        Err(Incompatible::Version { theirs })
    }
}

/// Mark an outgoing peer request with our version.
pub fn stamp<T>(req: &mut Request<T>) {
    req.metadata_mut()
        .insert(HEADER, MetadataValue::from(PROTOCOL_VERSION));
}

/// The peer service's interceptor: refuse (and log once per request) an incompatible caller.
#[allow(clippy::result_large_err)] // tonic's interceptor signature.
pub fn check(req: Request<()>) -> Result<Request<()>, Status> {
    let header = req
        .metadata()
        .get(HEADER)
        .map(|v| v.to_str().unwrap_or("?"));
    match negotiate(header) {
        Ok(_) => Ok(req),
        Err(e) => {
            tracing::warn!(remote = ?req.remote_addr(), error = %e, "refused a peer");
            Err(crate::status::incompatible_peer(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_negotiated() {
        assert_eq!(negotiate(None), Ok(1), "a build from before the header");
        assert_eq!(negotiate(Some("1")), Ok(1));
        let err = negotiate(Some("2")).expect_err("newer refused").to_string();
        assert!(err.contains("caller speaks version 2"), "{err}");
        assert!(
            err.contains(&format!("this agent speaks {PROTOCOL_VERSION}")),
            "{err}"
        );
        assert_eq!(
            negotiate(Some("0")),
            Err(Incompatible::Version { theirs: 0 })
        );
        for junk in ["", "one", "-1", "99999999999"] {
            assert!(
                matches!(negotiate(Some(junk)), Err(Incompatible::Unreadable(_))),
                "{junk}"
            );
        }
    }

    #[test]
    fn a_stamped_request_passes_the_check() {
        let mut req = Request::new(());
        stamp(&mut req);
        assert!(check(req).is_ok());
        let mut req = Request::new(());
        req.metadata_mut().insert(HEADER, MetadataValue::from(7u32));
        let status = check(req).expect_err("refused");
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert!(
            status.message().contains("version 7"),
            "{}",
            status.message()
        );
    }
}
