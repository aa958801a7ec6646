//! The failpoints build of the agent: `gpu-agent` compiled with `--features failpoints` into
//! its own target directory (`<target>/failpoints/`, so the normal build's artifacts stay
//! failpoint-free), built on first use by running cargo, and the `FAIL_POINTS` value that
//! switches points on (names in `gpu_raft_store`'s `failpoint.rs`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::Context;
use gpu_tests::AgentCommand;

/// A prebuilt failpoints agent to use instead of building one.
pub const AGENT_ENV: &str = "GPUMESH_FAILPOINTS_AGENT";

/// The workspace root (this crate's parent).
fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("chaos/ has a parent")
        .to_path_buf()
}

/// `$CARGO_TARGET_DIR/failpoints`, else `<workspace>/target/failpoints`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
        .join("failpoints")
}

/// The failpoints agent binary: `$GPUMESH_FAILPOINTS_AGENT`, else built (once per process,
/// while no cluster of this process runs; cargo makes a later call a quick no-op) with debug
/// info off to keep the build short.
pub fn agent() -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn build() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(AGENT_ENV) {
        return Ok(PathBuf::from(path));
    }
    // A build on two cores would starve a cluster another test is running.
    let _turn = gpu_tests::exclusive();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let dir = target_dir();
    let started = std::time::Instant::now();
    eprintln!(
        "building gpu-agent with --features failpoints into {}",
        dir.display()
    );
    let status = Command::new(cargo)
        .current_dir(workspace())
        .args(["build", "--locked", "-p", "gpu-agent", "--bin", "gpu-agent"])
        .args(["--features", "failpoints", "--target-dir"])
        .arg(&dir)
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .context("running cargo build for the failpoints agent")?;
    anyhow::ensure!(
        status.success(),
        "cargo build --features failpoints: {status}"
    );
    eprintln!(
        "failpoints agent ready in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(dir.join("debug").join("gpu-agent"))
}

/// Run the failpoints agent with `FAIL_POINTS=<points>` (empty: every point off).
pub fn command(points: &str) -> anyhow::Result<AgentCommand> {
    let env = if points.is_empty() {
        Vec::new()
    } else {
        vec![("FAIL_POINTS".to_owned(), points.to_owned())]
    };
    Ok(AgentCommand {
        bin: Some(agent()?),
        env,
        ..AgentCommand::default()
    })
}
