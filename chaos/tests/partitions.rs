//! Whole-cluster partitions in network namespaces, each with the fixed seed and parameters of
//! `gpu_chaos::catalog` (`GPUMESH_CHAOS_SEED` overrides): C6 (the leader's side of a two-three
//! split is the minority), C7 (a ring of five: every agent sees a different majority) and C8
//! (flapping cuts). Every checker must find nothing. Skipped with a message where namespaces
//! are unavailable.

use std::path::PathBuf;

use gpu_chaos::catalog;
use gpu_chaos::ready::namespaces_or_skip;
use gpu_chaos::scenario;
use gpu_chaos::seed::seed_or;

async fn scenario(short: &str) {
    if !namespaces_or_skip(short) {
        return;
    }
    let e = catalog::find(short).unwrap_or_else(|| panic!("no scenario {short}"));
    let seed = seed_or(e.default_seed).expect("seed");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaos");
    let report = scenario::run(e.name, seed, e.nemesis, &out)
        .await
        .unwrap_or_else(|err| panic!("{} (seed {seed}) did not complete: {err:#}", e.name));
    println!("{}", report.summary());
    let lines: Vec<String> = report.violations.iter().map(ToString::to_string).collect();
    assert!(
        report.violations.is_empty(),
        "{} seed {seed}: {} violation(s):\n{}",
        e.name,
        lines.len(),
        lines.join("\n")
    );
    assert!(report.acked_jobs > 0, "{}: nothing acknowledged", e.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c6_leader_side_of_a_split_is_the_minority() {
    scenario("c6").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c7_ring_every_agent_sees_a_different_majority() {
    scenario("c7").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c8_flapping_partitions() {
    scenario("c8").await;
}
