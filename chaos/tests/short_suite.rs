//! The short chaos suite: C1 (leader kill loop), C2 (random minority kill loop), C3 (kill
//! every node at once), C4 (rolling restart under load), C5 (leader isolated), C9 (leader
//! paused), C10 (GPU holder paused, and cut off, past its lease), C11 (Raft messages delayed,
//! lost and duplicated in the agents), C12 (a voter lost for good), C13 (a follower behind a
//! purged log), C14 (crashes at failpoints), C15 (fsync errors), C16 (client retry storm) and C17 (the storm without idempotency keys)
//! with the fixed seeds and parameters of `gpu_chaos::catalog` (`GPUMESH_CHAOS_SEED`
//! overrides); every checker must find nothing. The partition scenarios run the agents in
//! network namespaces and are skipped with a message where those are unavailable.

use std::path::PathBuf;

use gpu_chaos::catalog;
use gpu_chaos::ready::namespaces_or_skip;
use gpu_chaos::scenario;
use gpu_chaos::seed::seed_or;

fn out_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaos")
}

/// Run the catalog's scenario `short` (the same name, seed and nemesis `gpu-chaos run` uses).
async fn scenario(short: &str) {
    let e = catalog::find(short).unwrap_or_else(|| panic!("no scenario {short}"));
    let (name, nemesis) = (e.name, e.nemesis);
    let seed = seed_or(e.default_seed).expect("seed");
    let report = scenario::run(name, seed, nemesis, &out_dir())
        .await
        .unwrap_or_else(|e| panic!("{name} (seed {seed}) did not complete: {e:#}"));
    println!("{}", report.summary());
    let lines: Vec<String> = report.violations.iter().map(ToString::to_string).collect();
    assert!(
        report.violations.is_empty(),
        "{name} seed {seed}: {} violation(s):\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert!(
        report.acked_jobs > 0,
        "{name}: the workload acknowledged nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c1_leader_kill_loop() {
    scenario("c1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c2_random_minority_kill_loop() {
    scenario("c2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c4_rolling_restart_under_load() {
    scenario("c4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c3_kill_every_node_at_once() {
    scenario("c3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c16_client_retry_storm() {
    scenario("c16").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_keyless_retries_across_a_leader_kill() {
    scenario("c17").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c11_raft_messages_delayed_lost_and_duplicated() {
    scenario("c11").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c9_leader_paused_past_the_election_timeout() {
    scenario("c9").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c10_gpu_holder_paused_past_its_lease() {
    scenario("c10-paused").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c12_voter_lost_under_load_the_learner_is_promoted() {
    scenario("c12").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_follower_behind_a_purged_log_installs_a_snapshot() {
    scenario("c13").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c14_crash_at_vote_and_append_failpoints() {
    scenario("c14-log").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c14_crash_at_apply_and_snapshot_failpoints() {
    scenario("c14-apply").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c14_crash_while_installing_a_snapshot() {
    scenario("c14-install").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c15_fsync_error_stops_the_agent() {
    scenario("c15").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c5_leader_isolated() {
    if !namespaces_or_skip("C5 (leader isolated)") {
        return;
    }
    scenario("c5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c10_gpu_holder_cut_off_past_its_lease() {
    if !namespaces_or_skip("C10 by partition") {
        return;
    }
    scenario("c10-cut").await;
}
