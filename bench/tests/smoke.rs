//! The CI smoke runs of `gpu-bench run --quick`, a small `gpu-bench lifetime`, `codec` and
//! `layers`: every benchmark runs and reports; no figure is judged (timings on shared machines
//! are noise). etcd joins when installed, and must be when `GPUMESH_REQUIRE_ETCD` is set (CI).

use std::process::Command;

/// Whether `etcd` is installed; it must be under `GPUMESH_REQUIRE_ETCD`.
fn etcd_installed() -> bool {
    let has_etcd = Command::new("etcd").arg("--version").output().is_ok();
    let required = std::env::var_os("GPUMESH_REQUIRE_ETCD").is_some();
    assert!(
        has_etcd || !required,
        "GPUMESH_REQUIRE_ETCD is set but `etcd` is not installed (apt-get install etcd-server)"
    );
    has_etcd
}

/// Run `gpu-bench args` to success and return what it printed.
fn gpu_bench(args: &[&str]) -> String {
    let out = Command::new(gpu_tests::bin("gpu-bench"))
        .args(args)
        .output()
        .expect("run gpu-bench");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "gpu-bench {args:?} failed: {}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn the_quick_run_reports_every_benchmark() {
    let has_etcd = etcd_installed();
    let json = tempfile::NamedTempFile::new().expect("temp file");
    let mut cmd = Command::new(gpu_tests::bin("gpu-bench"));
    cmd.args(["run", "--quick", "--json"]).arg(json.path());
    if !has_etcd {
        cmd.arg("--skip-etcd");
    }
    let out = cmd.output().expect("run gpu-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "gpu-bench failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for section in [
        "fsync floor",
        "Replicated writes",
        "Submit → bound",
        "Failover",
        "Jobs submitted and finished",
    ] {
        assert!(
            stdout.contains(section),
            "no {section:?} in the report:\n{stdout}"
        );
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(json.path()).expect("read json")).expect("json");
    for row in report["writes"].as_array().expect("writes") {
        assert!(
            row["gpumesh"]["acked"].as_u64() > Some(0),
            "no acked write: {row}"
        );
        assert!(
            row["gpumesh"]["cpu_ms_per_write"].as_f64() > Some(0.0),
            "the agents' CPU was not counted: {row}"
        );
        // The split by thread accounts for all of it.
        let by_thread = row["gpumesh"]["cpu_ms_per_write_by_thread"]
            .as_object()
            .expect("CPU by thread");
        let split: f64 = by_thread
            .values()
            .filter_map(serde_json::Value::as_f64)
            .sum();
        let whole = row["gpumesh"]["cpu_ms_per_write"].as_f64().expect("CPU");
        assert!((split - whole).abs() < 1e-6 * whole.max(1.0), "{row}");
        assert!(by_thread.contains_key("tokio-rt-worker"), "{row}");
        if has_etcd {
            assert!(
                row["etcd"]["acked"].as_u64() > Some(0),
                "no etcd put: {row}"
            );
        }
    }
    assert_eq!(report["failover_gpumesh"]["count"], 1);
    assert_eq!(report["placement_idle"]["to_running"]["count"], 5);
    let state = &report["state"];
    let jobs: Vec<_> = state["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .map(|c| c["jobs"].as_u64())
        .collect();
    assert_eq!(jobs, [Some(0), Some(20), Some(50)], "{state}");
    assert!(state["snapshot_bytes"].as_u64() > Some(0), "{state}");
}

#[test]
fn a_small_lifetime_run_samples_every_agent_and_draws_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (svg, json) = (dir.path().join("rss.svg"), dir.path().join("run.json"));
    let out = Command::new(gpu_tests::bin("gpu-bench"))
        .args(["lifetime", "--jobs", "40", "--samples", "2", "--svg"])
        .arg(&svg)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run gpu-bench");
    assert!(
        out.status.success(),
        "gpu-bench lifetime failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("read json")).expect("json");
    let jobs: Vec<_> = (run["checkpoints"].as_array().expect("checkpoints").iter())
        .map(|c| c["jobs"].as_u64())
        .collect();
    assert_eq!(jobs, [Some(0), Some(20), Some(40)], "{run}");
    let svg = std::fs::read_to_string(&svg).expect("read svg");
    assert_eq!(svg.matches("<polyline").count(), 3, "one line per agent");
}

#[test]
fn the_codec_comparison_prints_every_record() {
    let text = gpu_bench(&["codec", "--jobs", "200", "--rounds", "1"]);
    for record in [
        "snapshot, 200 jobs",
        "a submission",
        "binding 64 jobs",
        "a run's end",
    ] {
        assert!(text.contains(record), "{record} missing: {text}");
    }
}

#[test]
fn the_layers_run_times_each_layer_on_every_target() {
    let has_etcd = etcd_installed();
    let skip_etcd = if has_etcd { None } else { Some("--skip-etcd") };
    let text = gpu_bench(
        &["layers", "--seconds", "1"]
            .into_iter()
            .chain(skip_etcd)
            .collect::<Vec<_>>(),
    );
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("| a ")).collect();
    assert_eq!(rows.len(), 3, "{text}");
    for row in rows {
        // gpumesh, and etcd plain and with mutual TLS where it runs: each a time.
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let timed = if has_etcd { 2..5 } else { 2..3 };
        for cell in &cells[timed] {
            assert!(cell.starts_with(|c: char| c.is_ascii_digit()), "{row}");
        }
    }
}

#[test]
fn the_stages_run_traces_every_step_of_a_write() {
    let text = gpu_bench(&["stages", "--writes", "30"]);
    // Every write is traced through every stage, unless another write shared its window
    // (the agents' own writes, now and then).
    let matched: usize = text
        .split_once(" of 30 writes matched")
        .and_then(|(before, _)| before.rsplit(char::is_whitespace).next()?.parse().ok())
        .unwrap_or_else(|| panic!("no count of matched writes: {text}"));
    assert!(matched >= 20, "{text}");
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| step"))
        .collect();
    assert_eq!(rows.len(), 16, "15 steps and the round trip: {text}");
    let round_trip: f64 = rows[15]
        .split('|')
        .nth(2)
        .and_then(|c| c.trim().parse().ok())
        .expect("a time");
    assert!(round_trip > 0.0, "{text}");
}
