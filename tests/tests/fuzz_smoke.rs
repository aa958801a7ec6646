//! The fuzz targets (`gpu_tests::fuzz`) on stable, in every test run: valid samples, thousands of
//! mutations of them, and random bytes, from a fixed seed. Deeper runs: `fuzz/README.md`.

use std::collections::BTreeMap;

use gpu_proto::v1 as pb;
use gpu_raft_store::{Command, Inventory, LogEntry};
use gpu_tests::{fuzz, shell_job};
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ROUNDS: usize = 3000;

/// Flip, drop, duplicate or insert bytes; sometimes truncate.
fn mutate(rng: &mut StdRng, sample: &[u8]) -> Vec<u8> {
    let mut out = sample.to_vec();
    for _ in 0..rng.random_range(1..8) {
        let at = if out.is_empty() {
            0
        } else {
            rng.random_range(0..out.len())
        };
        match rng.random_range(0..5) {
            0 if !out.is_empty() => out[at] ^= 1 << rng.random_range(0..8),
            1 if !out.is_empty() => {
                out.remove(at);
            }
            2 => out.insert(at, rng.random()),
            3 => out.insert(
                at,
                *b"{}[]\":,0-9eE.\\u"
                    .get(rng.random_range(0..16))
                    .unwrap_or(&b'0'),
            ),
            _ => out.truncate(at),
        }
    }
    out
}

fn drive(name: &str, target: fn(&[u8]), samples: &[Vec<u8>]) {
    let mut rng = StdRng::seed_from_u64(0x0067_7075_6d65_7368);
    for sample in samples {
        target(sample);
    }
    for i in 0..ROUNDS {
        let input = if i % 10 == 0 {
            (0..rng.random_range(0..256))
                .map(|_| rng.random())
                .collect()
        } else {
            let sample = &samples[i % samples.len()];
            mutate(&mut rng, sample)
        };
        let caught = std::panic::catch_unwind(|| target(&input));
        assert!(
            caught.is_ok(),
            "{name} panicked on input {:?}",
            String::from_utf8_lossy(&input)
        );
    }
}

fn entry(cmd: Command) -> Vec<u8> {
    serde_json::to_vec(&LogEntry {
        proposed_at_ms: 1_700_000_000_000,
        cmd,
        meta: None,
        request: None,
    })
    .expect("json")
}

#[test]
fn token_header() {
    let samples = [
        "Bearer t0a1b2c.00ff",
        "Bearer a.b",
        "Bearer ",
        "bearer x.y",
        "Bearer ...",
    ];
    drive(
        "token_header",
        fuzz::token_header,
        &samples.map(|s| s.as_bytes().to_vec()),
    );
}

#[test]
fn log_entry() {
    let spec =
        gpu_agent::api::from_proto::spec(shell_job("train", 2, "sleep 1")).expect("a plain spec");
    let samples = vec![
        entry(Command::SubmitJob {
            spec: Box::new(spec),
            idempotency_key: Some("k".into()),
            hold: false,
            owner: None,
        }),
        entry(Command::CancelJob { job: 1 }),
        entry(Command::RegisterNode {
            node: 3,
            addr: "10.0.0.3:7070".into(),
            labels: BTreeMap::from([("rack".into(), "r1".into())]),
            inventory: Inventory::default(),
            edge: None,
            protocol: 1,
        }),
        entry(Command::RevokeCertificate {
            serial: "0a".into(),
            reason: "x".into(),
        }),
        entry(Command::CreateTenant {
            tenant: gpu_raft_store::TenantRecord {
                name: "vision".into(),
                quotas: BTreeMap::from([(
                    "A100".into(),
                    gpu_raft_store::Quota {
                        guaranteed: 4,
                        borrow: 2,
                    },
                )]),
                weight: 2,
                default_priority: -1,
                created_at_ms: 0,
                updated_at_ms: 0,
                account: None,
                allowed_mounts: Vec::new(),
                max_priority: None,
                max_pending_jobs: None,
                webhook: None,
            },
        }),
        entry(Command::PreemptJobs {
            preemptions: vec![gpu_raft_store::Preempt {
                job: 1,
                generation: 1,
                for_job: 2,
            }],
        }),
    ];
    drive("log_entry", fuzz::log_entry, &samples);
}

#[test]
fn raft_messages() {
    let samples = [
        r#"{"vote":{"leader_id":{"term":1,"node_id":2},"committed":false},"last_log_id":null}"#,
        r#"{"vote":{"leader_id":{"term":3,"node_id":1},"committed":true},"prev_log_id":{"leader_id":{"term":3,"node_id":1},"index":7},"entries":[],"leader_commit":null}"#,
    ];
    drive(
        "raft_messages",
        fuzz::raft_messages,
        &samples.map(|s| s.as_bytes().to_vec()),
    );
}

#[test]
fn submit_request() {
    let samples: Vec<Vec<u8>> = [0, 1, 8]
        .into_iter()
        .map(|gpus| {
            pb::SubmitJobRequest {
                spec: Some(shell_job("train", gpus, "echo hi")),
                idempotency_key: "key".into(),
                hold: false,
            }
            .encode_to_vec()
        })
        .collect();
    drive("submit_request", fuzz::submit_request, &samples);
}

#[test]
fn certificate() {
    let (_, csr) = gpu_agent::tls::pki::new_request().expect("csr");
    let ca = gpu_agent::tls::pki::new_ca(
        std::time::SystemTime::now(),
        std::time::Duration::from_secs(60),
    )
    .expect("ca");
    drive(
        "certificate",
        fuzz::certificate,
        &[csr.into_bytes(), ca.cert_pem.into_bytes()],
    );
}
