//! The supervisor's part of a container run: read what the executor decided
//! (`container.json`), write the environment file the runtime reads, fetch the image, and after
//! the job tell a container that never started from a job that failed, and leave no container
//! behind. The command lines themselves are `container_cmd`'s.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use gpu_raft_store::Outcome;
use tokio::process::Command;

use super::container_cmd::ContainerRun;

/// The file in a run directory that describes its container.
const RUN_FILE: &str = "container.json";
/// The environment file a runtime reads (root's, 0600; removed when the run ends).
const ENV_FILE: &str = "container.env";

/// Write `run` into the run directory (the executor, before the supervisor starts).
pub(crate) fn write(dir: &Path, run: &ContainerRun) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(run).map_err(std::io::Error::other)?;
    std::fs::write(dir.join(RUN_FILE), json)
}

/// Read the run's container description (the supervisor).
pub(crate) fn read(dir: &Path) -> Result<ContainerRun, String> {
    let path = dir.join(RUN_FILE);
    let text = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_slice(&text).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// Write the job's environment as `KEY=VALUE` lines, readable by the supervisor's user alone.
/// A value with a line break cannot be written so: the run fails with its name.
pub(crate) fn write_env_file(
    dir: &Path,
    env: &BTreeMap<String, String>,
) -> Result<PathBuf, String> {
    let mut text = String::new();
    for (k, v) in env {
        if v.contains(['\n', '\r']) {
            return Err(format!(
                "environment variable {k} holds a line break, which a container's environment \
                 file cannot carry"
            ));
        }
        text.push_str(&format!("{k}={v}\n"));
    }
    let path = dir.join(ENV_FILE);
    write_private(&path, text.as_bytes())
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

/// Replace `path` with a new file of `bytes` that only its owner (root) may read: made 0600 at
/// creation, never readable by anyone else in between.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::remove_file(path).ok();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
}

/// Remove the environment file (the run has ended).
pub(crate) fn remove_env_file(dir: &Path) {
    std::fs::remove_file(dir.join(ENV_FILE)).ok();
}

/// Run one step of the runtime's (image check, fetch, stop, cleanup) to its end: its exit
/// status and its output. `prepare` makes the command the job's (user, cgroups) for the
/// unprivileged runtimes.
pub(crate) async fn step(
    argv: &[OsString],
    prepare: impl FnOnce(&mut Command) -> Result<(), String>,
) -> Result<(bool, String), String> {
    let (mut cmd, program) = runtime_command(argv, prepare)?;
    let out = cmd.output().await.map_err(|e| format!("{program}: {e}"))?;
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    Ok((out.status.success(), text))
}

/// The runtime command `argv`, its output piped, made the job's by `prepare`; and the
/// program's name, for errors.
pub(crate) fn runtime_command(
    argv: &[OsString],
    prepare: impl FnOnce(&mut Command) -> Result<(), String>,
) -> Result<(Command, String), String> {
    let program = argv.first().ok_or("an empty runtime command")?;
    let mut cmd = Command::new(program);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    prepare(&mut cmd)?;
    Ok((cmd, program.to_string_lossy().into_owned()))
}

/// The last line of a runtime's output that says something: the reason it gives.
pub(crate) fn last_words(output: &str) -> String {
    output
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no reason given")
        .to_owned()
}

/// What podman's exit status means when the container itself never started (its state is
/// still `created`): the run failed to start, not the job.
pub(crate) fn never_started(code: i32, image: &str) -> Outcome {
    let why = match code {
        126 => "the command cannot be run in the image (not executable)".to_owned(),
        127 => "the command does not exist in the image".to_owned(),
        c => format!("the container runtime failed (exit {c})"),
    };
    Outcome::FailedToStart {
        message: format!("{image}: {why}; the runtime's message is in the job's stderr log"),
    }
}

/// Whether podman's container `name` was created but never started.
pub(crate) async fn podman_never_started(program: &Path, name: &str) -> bool {
    let argv: Vec<OsString> = vec![
        program.into(),
        "inspect".into(),
        "--format".into(),
        "{{.State.Status}}".into(),
        name.into(),
    ];
    // The output is the runtime's warnings, if any, then the answer.
    matches!(step(&argv, |_| Ok(())).await, Ok((true, out)) if out.lines().any(|l| l.trim() == "created"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_file_is_the_supervisors_and_refuses_line_breaks() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("valid");
        let env = BTreeMap::from([
            ("A".to_owned(), "1".to_owned()),
            ("B".to_owned(), "x=y z".to_owned()),
        ]);
        let path = write_env_file(dir.path(), &env).expect("valid");
        assert_eq!(
            std::fs::read_to_string(&path).expect("valid"),
            "A=1\nB=x=y z\n"
        );
        let mode = std::fs::metadata(&path)
            .expect("valid")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let bad = BTreeMap::from([("SECRET".to_owned(), "a\nb".to_owned())]);
        let e = write_env_file(dir.path(), &bad).expect_err("refused");
        assert!(e.contains("SECRET") && e.contains("line break"), "{e}");
        assert!(!e.contains("a\nb"), "the value is never repeated: {e}");
    }

    #[test]
    fn never_started_names_the_cause() {
        let text = |o: Outcome| match o {
            Outcome::FailedToStart { message } => message,
            other => panic!("{other:?}"),
        };
        assert!(text(never_started(127, "img")).contains("does not exist in the image"));
        assert!(text(never_started(126, "img")).contains("not executable"));
        assert!(text(never_started(125, "img")).contains("runtime failed (exit 125)"));
        assert_eq!(
            last_words("a\nError: no such image\n\n"),
            "Error: no such image"
        );
    }
}
