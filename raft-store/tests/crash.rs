//! Crash durability: a child process appends to a real store and reports each append that the
//! store called durable; the parent `kill -9`s it at random moments, reopens the directory and
//! checks that every reported append is present, unchanged, with no hole in the log.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command as Process, Stdio};
use std::time::Duration;

use gpu_raft_store::testing::register_entry as entry;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{RaftLogReader, Vote};
use rand::{Rng, SeedableRng};

const CHILD_DIR_ENV: &str = "GPUMESH_CRASH_CHILD_DIR";

/// The writer half. Runs only when the parent test re-executes this binary with the env var set.
#[tokio::test]
async fn crash_child_writer() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let (_dir, mut log, _sm) = gpu_raft_store::open(dir.as_ref()).expect("child open");
    let mut next = log
        .get_log_state()
        .await
        .expect("state")
        .last_log_id
        .map_or(1, |l| l.index + 1);
    let mut term = log
        .read_vote()
        .await
        .expect("vote")
        .map_or(1, |v| v.leader_id.term + 1);
    let mut out = std::io::stdout().lock();
    for round in 0u64.. {
        let batch = 1 + round % 7;
        log.blocking_append((next..next + batch).map(entry))
            .await
            .expect("append");
        next += batch;
        writeln!(out, "durable {}", next - 1).expect("stdout");
        if round % 5 == 0 {
            log.save_vote(&Vote::new(term, 1)).await.expect("vote");
            writeln!(out, "vote {term}").expect("stdout");
            term += 1;
        }
        out.flush().expect("flush");
    }
}

#[tokio::test]
async fn kill_9_never_loses_a_durable_append() {
    let seed: u64 = std::env::var("GPUMESH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("seed {seed} (set GPUMESH_SEED to reproduce)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut reported_index = 0u64;
    let mut reported_term = 0u64;

    for round in 0..6 {
        let mut child = Process::new(std::env::current_exe().expect("exe"))
            .args([
                "crash_child_writer",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR_ENV, tmp.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect::<Vec<_>>()
        });
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..600))).await;
        child.kill().expect("kill -9");
        child.wait().expect("reap");
        let lines = reader.join().expect("reader");
        for line in &lines {
            if let Some(i) = line.strip_prefix("durable ") {
                reported_index = reported_index.max(i.parse().expect("index"));
            }
            if let Some(t) = line.strip_prefix("vote ") {
                reported_term = reported_term.max(t.parse().expect("term"));
            }
        }

        let (_dir, mut log, _sm) = gpu_raft_store::open(tmp.path()).expect("reopen after kill");
        let last = log
            .get_log_state()
            .await
            .expect("state")
            .last_log_id
            .map_or(0, |l| l.index);
        assert!(
            last >= reported_index,
            "round {round}: reported {reported_index} durable, log ends at {last}"
        );
        let entries = log.try_get_log_entries(1..=last).await.expect("read");
        assert_eq!(entries.len() as u64, last, "round {round}: hole in the log");
        for (i, e) in entries.iter().enumerate() {
            assert_eq!(
                *e,
                entry(i as u64 + 1),
                "round {round}: entry {} changed",
                i + 1
            );
        }
        let term = log
            .read_vote()
            .await
            .expect("vote")
            .map_or(0, |v| v.leader_id.term);
        assert!(
            term >= reported_term,
            "round {round}: vote {reported_term} reported, {term} on disk"
        );
    }
    assert!(
        reported_index > 0,
        "the child never reported an append: the test proved nothing"
    );
}
