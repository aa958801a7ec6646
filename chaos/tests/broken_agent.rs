//! The checkers can fail: an agent built with the `failpoints` feature and switched into a
//! deliberate bug (`apply-bind-forgets-gpus`: `apply` binds without marking the GPUs held, so
//! the scheduler and the bind re-check both see them free) runs a quiet workload, and the
//! harness reports GPU overlaps; the same build and scenario with the point off is clean.
//! The first test builds the failpoints agent into `target/failpoints/` (cargo, once).

use std::path::PathBuf;

use gpu_chaos::scenario::{self, Nemesis, Setup};
use gpu_chaos::{failpoints, seed::seed_or};

fn out_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaos-broken")
}

const QUIET: Nemesis = Nemesis::Quiet { secs: 8 };

async fn quiet(name: &str, points: &str) -> scenario::Report {
    let seed = seed_or(21).expect("seed");
    let setup = Setup {
        agent: failpoints::command(points).expect("the failpoints agent"),
        ..Setup::default()
    };
    let report = scenario::run_with(name, seed, QUIET, &out_dir(), &setup)
        .await
        .unwrap_or_else(|e| panic!("{name} (seed {seed}) did not complete: {e:#}"));
    println!("{}", report.summary());
    for v in &report.violations {
        println!("  {v}");
    }
    assert!(report.acked_jobs > 0, "{name}: nothing acknowledged");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_overlap_is_reported_when_apply_forgets_held_gpus() {
    let report = quiet("broken-bind", "apply-bind-forgets-gpus=return").await;
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.checker == "gpu-overlap" && v.kind == "gpu-overlap"),
        "the broken agent shared GPUs but gpu-overlap reported nothing: {:?}",
        report.violations
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_build_with_the_point_off_is_clean() {
    let report = quiet("broken-bind-off", "").await;
    let lines: Vec<String> = report.violations.iter().map(ToString::to_string).collect();
    assert!(lines.is_empty(), "violations:\n{}", lines.join("\n"));
}
