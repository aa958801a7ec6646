//! The supervisor's image pull: runs the runtime's fetch command, turns its output into the
//! run's phase as it comes (`pull_progress`, written to the run directory's `phase` for the
//! executor to report), and gives up at once when the run must stop (cancel, eviction, a lost
//! lease): a pull that hangs on a registry never holds a cancelled job.

use std::ffi::OsString;
use std::future::Future;

use gpu_raft_store::Outcome;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use super::container_supervise::runtime_command;
use super::job_dir::JobDir;
use super::pull_progress::PullProgress;

/// The most of the pull's output kept for the job's stderr log when it fails.
const OUTPUT_KEPT: usize = 64 * 1024;

/// How a pull ended.
pub(crate) enum Pulled {
    Done,
    /// The runtime failed; its output.
    Failed(String),
    /// The run had to stop first: its outcome (the pull was killed).
    Stopped(Outcome),
}

/// Run `argv` (made the runtime user's by `prepare`), keeping `dir`'s phase up to date, until it
/// ends or `stop` resolves.
pub(crate) async fn pull(
    argv: &[OsString],
    prepare: impl FnOnce(&mut Command) -> Result<(), String>,
    progress: &mut PullProgress,
    dir: &JobDir,
    stop: impl Future<Output = Outcome>,
) -> Result<Pulled, String> {
    let (mut cmd, program) = runtime_command(argv, prepare)?;
    let mut child = cmd.spawn().map_err(|e| format!("{program}: {e}"))?;
    let (Some(stderr), Some(stdout)) = (child.stderr.take(), child.stdout.take()) else {
        return Err("the runtime's output pipes are missing".into());
    };
    let mut err_lines = BufReader::new(stderr).lines();
    let mut out_lines = BufReader::new(stdout).lines();
    let (mut err_open, mut out_open) = (true, true);
    let mut output = String::new();
    dir.write_phase(&progress.phase()).ok();
    tokio::pin!(stop);
    while err_open || out_open {
        let line = tokio::select! {
            outcome = &mut stop => return Ok(Pulled::Stopped(outcome)),
            line = err_lines.next_line(), if err_open => line.ok().flatten().or_else(|| {
                err_open = false;
                None
            }),
            line = out_lines.next_line(), if out_open => line.ok().flatten().or_else(|| {
                out_open = false;
                None
            }),
        };
        if let Some(line) = line {
            progress.line(&line);
            dir.write_phase(&progress.phase()).ok();
            keep(&mut output, &line);
        }
    }
    let status = tokio::select! {
        outcome = &mut stop => return Ok(Pulled::Stopped(outcome)),
        status = child.wait() => status.map_err(|e| format!("waiting for the pull: {e}"))?,
    };
    Ok(if status.success() {
        Pulled::Done
    } else {
        Pulled::Failed(output)
    })
}

/// Append `line`, keeping at most the last `OUTPUT_KEPT` bytes.
fn keep(output: &mut String, line: &str) {
    output.push_str(line);
    output.push('\n');
    if output.len() > OUTPUT_KEPT {
        let mut cut = output.len() - OUTPUT_KEPT;
        while !output.is_char_boundary(cut) {
            cut += 1;
        }
        output.drain(..cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_dir() -> (tempfile::TempDir, JobDir) {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = JobDir::new(root.path(), 7, 1);
        dir.create().expect("run dir");
        (root, dir)
    }

    fn sh(script: &str) -> Vec<OsString> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[tokio::test]
    async fn the_phase_follows_the_output_and_a_failure_keeps_it() {
        let (_root, dir) = run_dir();
        let mut progress = PullProgress::new("img");
        let never = std::future::pending();
        let script = "echo 'Copying blob sha256:a' >&2; echo 'Copying blob sha256:b' >&2; \
                      echo 'Error: denied' >&2; exit 1";
        let pulled = pull(&sh(script), |_| Ok(()), &mut progress, &dir, never)
            .await
            .expect("ran");
        let Pulled::Failed(output) = pulled else {
            panic!("the command failed")
        };
        assert!(output.ends_with("Error: denied\n"), "{output}");
        assert_eq!(
            dir.phase().as_deref(),
            Some("pulling image img: copying layers (2)")
        );
        let ok = pull(
            &sh("true"),
            |_| Ok(()),
            &mut progress,
            &dir,
            std::future::pending(),
        )
        .await
        .expect("ran");
        assert!(matches!(ok, Pulled::Done));
    }

    #[tokio::test]
    async fn a_stop_ends_a_hanging_pull_at_once_and_kills_it() {
        let (root, dir) = run_dir();
        let marker = root.path().join("survived");
        let script = format!("sleep 30; touch {}", marker.display());
        let mut progress = PullProgress::new("img");
        let stop = async {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            Outcome::Cancelled
        };
        let asked = std::time::Instant::now();
        let pulled = pull(&sh(&script), |_| Ok(()), &mut progress, &dir, stop)
            .await
            .expect("ran");
        assert!(matches!(pulled, Pulled::Stopped(Outcome::Cancelled)));
        assert!(asked.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(dir.phase().as_deref(), Some("pulling image img"));
        // `sh` was killed (kill on drop): the rest of its script never runs.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!marker.exists());
    }

    #[test]
    fn only_the_end_of_a_long_output_is_kept() {
        let mut out = String::new();
        for i in 0..20_000 {
            keep(&mut out, &format!("line {i}"));
        }
        assert!(out.len() <= OUTPUT_KEPT);
        assert!(out.ends_with("line 19999\n"));
    }
}
