//! Fuzz target bodies: what every decoder and parser at the edge must do with arbitrary bytes —
//! answer (a value or a clean error), never panic — plus properties that tie the edge to
//! `apply`. Driven by libFuzzer through `fuzz/` (`cargo +nightly fuzz run <target>`) and, on
//! stable in every test run, by `tests/fuzz_smoke.rs` with random and mutated inputs.

use std::time::{Duration, SystemTime};

use gpu_agent::api::auth::token;
use gpu_agent::tls::pki;
use gpu_proto::v1 as pb;
use gpu_raft_store::{ApplyResult, ClusterState, Command, LogEntry, NodeId, TypeConfig, validate};
use prost::Message;

/// The `authorization` header parser: whatever it accepts is a plausible `<id>.<secret>`.
pub fn token_header(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some((id, secret)) = token::parse_header(text) {
        assert!(!id.is_empty() && !secret.is_empty() && id.len() <= 128 && secret.len() <= 128);
        assert!(token::matches(secret, &token::digest(secret)));
        assert!(!token::matches(
            secret,
            &token::digest(&format!("{secret}x"))
        ));
    }
}

/// A log entry off the wire (a forwarded proposal, a replicated entry): decoding never panics,
/// `apply` never panics, and a rejected command leaves the state as it was (bar its audit entry).
pub fn log_entry(data: &[u8]) {
    let Ok(entry) = serde_json::from_slice::<LogEntry>(data) else {
        return;
    };
    let mut state = ClusterState::new();
    let before = state.clone();
    if let ApplyResult::Rejected { .. } = state.apply(&entry) {
        state.audit.clear();
        assert_eq!(state, before, "a rejected {} changed the state", entry.cmd);
    }
}

/// openraft messages as agents exchange them: decoding never panics.
pub fn raft_messages(data: &[u8]) {
    let _ = serde_json::from_slice::<openraft::raft::AppendEntriesRequest<TypeConfig>>(data);
    let _ = serde_json::from_slice::<openraft::raft::VoteRequest<NodeId>>(data);
    let _ = serde_json::from_slice::<openraft::raft::InstallSnapshotRequest<TypeConfig>>(data);
}

/// A submission as protobuf: decoding never panics, and a spec the edge accepts is one `apply`
/// accepts too (the two validations cannot drift apart).
pub fn submit_request(data: &[u8]) {
    let Ok(req) = pb::SubmitJobRequest::decode(data) else {
        return;
    };
    let Some(spec) = req.spec else { return };
    let Ok(spec) = gpu_agent::api::from_proto::spec(spec) else {
        return;
    };
    if validate::job_spec(&spec).is_err() {
        return;
    }
    let entry = LogEntry {
        proposed_at_ms: 1,
        cmd: Command::submit(spec),
        meta: None,
        request: None,
    };
    let result = ClusterState::new().apply(&entry);
    assert!(
        matches!(result, ApplyResult::JobSubmitted { .. }),
        "the edge accepted a spec apply refuses: {result:?}"
    );
}

/// Certificates and signing requests from strangers: reading and signing never panic, and
/// nothing but a real request is signed.
pub fn certificate(data: &[u8]) {
    let _ = pki::inspect(data);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = pki::inspect_pem(text);
    let now = SystemTime::now();
    let ca = test_ca();
    if let Ok(cert) = pki::sign(
        ca,
        text,
        &pki::Subject::Node(1),
        now,
        Duration::from_secs(60),
    ) {
        let info = pki::inspect_pem(&cert).expect("what we sign we can read");
        assert_eq!(info.subject, pki::Subject::Node(1));
    }
}

fn test_ca() -> &'static pki::KeyedCert {
    static CA: std::sync::OnceLock<pki::KeyedCert> = std::sync::OnceLock::new();
    CA.get_or_init(|| pki::new_ca(SystemTime::now(), Duration::from_secs(3600)).expect("a CA"))
}
