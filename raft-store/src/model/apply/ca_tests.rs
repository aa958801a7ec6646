use std::collections::{BTreeMap, BTreeSet};

use crate::model::ca::{CaCert, ResealedCredential};
use crate::model::cert::CertRecord;
use crate::model::command::{Command, LogEntry};
use crate::model::outcome::{ApplyResult, Rejection};
use crate::model::registry::SealedCredential;
use crate::model::state::ClusterState;

fn apply_at(s: &mut ClusterState, at: u64, cmd: Command) -> ApplyResult {
    s.apply(&LogEntry {
        proposed_at_ms: at,
        cmd,
        meta: None,
        request: None,
    })
}

fn apply(s: &mut ClusterState, cmd: Command) -> ApplyResult {
    apply_at(s, 100, cmd)
}

fn ca(n: char) -> CaCert {
    CaCert {
        key_id: n.to_string().repeat(64),
        cert_pem: format!("-----BEGIN CERTIFICATE-----\n{n}\n-----END CERTIFICATE-----\n"),
    }
}

fn introduce(current: char, next: char) -> Command {
    Command::IntroduceCa {
        current: ca(current),
        next: ca(next),
        sealed_key: "ab".repeat(40),
    }
}

fn switch(to: char) -> Command {
    Command::SwitchCa {
        key_id: ca(to).key_id,
        resealed: vec![],
    }
}

fn retire(which: char) -> Command {
    Command::RetireCa {
        key_id: ca(which).key_id,
    }
}

fn record(serial: &str, subject: &str, issuer: &str, issued_at_ms: u64) -> Command {
    Command::RecordCertificate {
        cert: CertRecord {
            serial: serial.into(),
            subject: subject.into(),
            not_after_ms: 10_000,
            issued_at_ms,
            revoked: false,
            revoked_reason: String::new(),
            issuer: issuer.into(),
        },
        enrolled_with: None,
    }
}

fn refused(result: &ApplyResult) -> String {
    match result {
        ApplyResult::Rejected { reason } => reason.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_rotation_introduces_switches_and_retires_in_order() {
    let mut s = ClusterState::new();
    apply(&mut s, record("01", "node 1", "", 10));
    apply(&mut s, record("0c", "client admin", "", 10));

    for early in [switch('b'), retire('a')] {
        let before = s.clone();
        assert!(refused(&apply(&mut s, early)).contains("no CA rotation has begun"));
        assert_eq!(s, before);
    }
    assert_eq!(apply(&mut s, introduce('a', 'b')), ApplyResult::Ok);
    let set = s.ca.clone().expect("a rotation");
    assert_eq!(set.signing, ca('a').key_id);
    assert_eq!(set.trusted.len(), 2);
    assert!(set.bundle_pem().starts_with(&ca('a').cert_pem));
    assert!(
        s.certificates.values().all(|c| c.issuer == ca('a').key_id),
        "the first rotation names the first CA as the issuer of every earlier certificate"
    );

    let before = s.clone();
    let why = refused(&apply(&mut s, introduce('a', 'c')));
    assert!(why.contains("was introduced already"), "{why}");
    let why = refused(&apply(&mut s, retire('a')));
    assert!(why.contains("signs: introduce another"), "{why}");
    assert_eq!(s, before);

    assert_eq!(apply(&mut s, switch('b')), ApplyResult::Ok);
    let set = s.ca.clone().expect("a rotation");
    assert_eq!(
        (set.signing.as_str(), set.next.is_none()),
        (ca('b').key_id.as_str(), true)
    );

    // Node 1 renewed under the new CA; the admin's client certificate did not.
    apply(&mut s, record("02", "node 1", &ca('b').key_id, 20));
    let before = s.clone();
    let why = refused(&apply(&mut s, retire('a')));
    assert!(
        why.contains("client admin (0c)") && !why.contains("node 1"),
        "{why}"
    );
    assert_eq!(s, before);
    assert_eq!(
        s.members_not_renewed([1, 2], 100),
        vec!["n2".to_owned()],
        "n2 has no certificate of the new CA on record"
    );
    apply(&mut s, record("0d", "client admin", &ca('b').key_id, 30));
    assert_eq!(apply(&mut s, retire('a')), ApplyResult::Ok);
    assert_eq!(
        s.ca.as_ref()
            .map(|c| c.trusted.keys().cloned().collect::<Vec<_>>()),
        Some(vec![ca('b').key_id])
    );
    assert_eq!(
        s.audit_signers,
        vec![ca('a').cert_pem],
        "the heads the old CA signed still verify"
    );
}

#[test]
fn an_introduced_ca_can_be_called_off() {
    let mut s = ClusterState::new();
    apply(&mut s, introduce('a', 'b'));
    assert_eq!(apply(&mut s, retire('b')), ApplyResult::Ok);
    let set = s.ca.clone().expect("a rotation");
    assert!(set.next.is_none() && set.trusted.len() == 1 && s.audit_signers.is_empty());
    assert_eq!(apply(&mut s, introduce('a', 'c')), ApplyResult::Ok);
    let why = refused(&apply(&mut s, switch('b')));
    assert!(why.contains("the CA introduced is"), "{why}");
}

#[test]
fn a_switch_carries_every_registry_login_sealed_again() {
    let login = |key: char, sealed: &str| SealedCredential {
        username: "bot".into(),
        sealed: sealed.into(),
        key_id: ca(key).key_id,
        set_at_ms: 5,
    };
    let mut s = ClusterState::new();
    s.registry_credentials = BTreeMap::from([(
        "vision".to_owned(),
        BTreeMap::from([
            ("nvcr.io".to_owned(), login('a', "0011")),
            ("ghcr.io".to_owned(), login('a', "2233")),
        ]),
    )]);
    apply(&mut s, introduce('a', 'b'));
    let resealed = |registry: &str, key: char| ResealedCredential {
        tenant: "vision".into(),
        registry: registry.into(),
        credential: login(key, "ffee"),
    };

    let before = s.clone();
    let partial = Command::SwitchCa {
        key_id: ca('b').key_id,
        resealed: vec![resealed("nvcr.io", 'b')],
    };
    let why = refused(&apply(&mut s, partial));
    assert!(
        why.contains("vision@ghcr.io is still sealed under the old CA"),
        "{why}"
    );
    let wrong_key = Command::SwitchCa {
        key_id: ca('b').key_id,
        resealed: vec![resealed("nvcr.io", 'a'), resealed("ghcr.io", 'b')],
    };
    assert!(refused(&apply(&mut s, wrong_key)).contains("not sealed under the new CA"));
    assert_eq!(s, before, "a refused switch changes nothing");

    let full = Command::SwitchCa {
        key_id: ca('b').key_id,
        resealed: vec![resealed("nvcr.io", 'b'), resealed("ghcr.io", 'b')],
    };
    assert_eq!(apply(&mut s, full), ApplyResult::Ok);
    let logins = &s.registry_credentials["vision"];
    assert!(
        logins
            .values()
            .all(|l| l.key_id == ca('b').key_id && l.sealed == "ffee")
    );
    assert!(logins.values().all(|l| l.set_at_ms == 5));
}

#[test]
fn agents_report_what_they_trust() {
    let mut s = ClusterState::new();
    let report = |node, ids: &[char]| Command::ReportTrust {
        node,
        key_ids: ids.iter().map(|c| ca(*c).key_id).collect::<BTreeSet<_>>(),
    };
    assert!(matches!(
        apply(&mut s, report(1, &['a'])),
        ApplyResult::Rejected {
            reason: Rejection::NotNow { .. }
        }
    ));
    apply(&mut s, introduce('a', 'b'));
    assert_eq!(apply(&mut s, report(1, &['a', 'b'])), ApplyResult::Ok);
    assert_eq!(apply(&mut s, report(2, &['a'])), ApplyResult::Ok);
    let set = s.ca.clone().expect("a rotation");
    assert!(set.installed_by(1) && !set.installed_by(2) && !set.installed_by(3));
    let bad = Command::ReportTrust {
        node: 1,
        key_ids: BTreeSet::from(["not hex".to_owned()]),
    };
    assert!(refused(&apply(&mut s, bad)).contains("64 lower-case hex"));
}

#[test]
fn malformed_cas_are_refused() {
    let mut s = ClusterState::new();
    let two_in_one = CaCert {
        cert_pem: ca('b').cert_pem.repeat(2),
        ..ca('b')
    };
    for bad in [
        Command::IntroduceCa {
            current: ca('a'),
            next: two_in_one,
            sealed_key: "ab".into(),
        },
        Command::IntroduceCa {
            current: ca('a'),
            next: ca('a'),
            sealed_key: "ab".into(),
        },
        Command::IntroduceCa {
            current: ca('a'),
            next: ca('b'),
            sealed_key: "not hex".into(),
        },
    ] {
        assert!(matches!(
            apply(&mut s, bad),
            ApplyResult::Rejected {
                reason: Rejection::Invalid { .. }
            }
        ));
    }
    assert_eq!(s, ClusterState::new());
}
