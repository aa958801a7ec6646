//! The job's environment on its way to the job: `<run>/env.json`, written by the executor,
//! read by the supervisor, applied to the job process alone.
//!
//! The supervisor runs as root; were it started with the job's environment, the job's
//! `LD_PRELOAD` (a file an earlier job could have written) would run inside it as root. So the
//! supervisor gets a fixed environment (`SUPERVISOR_ENV`) and the job's travels in this file:
//! mode 0600, owned by the supervisor's user, in the run directory (0711, the agent's), so the
//! job's user can neither read another run's secrets from it nor plant one. The format is
//! `{"format": 1, "env": {"NAME": "value", …}}`; unknown formats are refused.

use std::collections::BTreeMap;
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file's name in the run directory.
pub(crate) const FILE: &str = "env.json";

const FORMAT: u32 = 1;

/// The whole environment of the supervisor (`gpu-agent shim`): nothing of the job's and
/// nothing of the agent's own (no `LD_*`, no `RUST_LOG`, no credentials it was started with).
/// Its allocator runs without the agent's background purging thread: a supervisor holds
/// little memory, and thousands of short runs would each start one.
pub(crate) const SUPERVISOR_ENV: [(&str, &str); 3] = [
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    ("LANG", "C.UTF-8"),
    ("_RJEM_MALLOC_CONF", "background_thread:false"),
];

#[derive(Serialize, Deserialize)]
struct EnvFile {
    format: u32,
    env: BTreeMap<String, String>,
}

pub(crate) fn path(run_dir: &Path) -> PathBuf {
    run_dir.join(FILE)
}

/// Write `env` for the run in `run_dir`, atomically (a reader sees no file or the whole one):
/// a fresh 0600 temporary file (never an existing one or a link), then renamed. Not synced:
/// only a supervisor started after it reads it, and none survives the machine.
pub(crate) fn write(run_dir: &Path, env: &BTreeMap<String, String>) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(&EnvFile {
        format: FORMAT,
        env: env.clone(),
    })
    .map_err(std::io::Error::other)?;
    let tmp = run_dir.join(format!("{FILE}.tmp"));
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&bytes)?;
    fs::rename(&tmp, path(run_dir))
}

/// The environment recorded for the run in `run_dir`. Refused unless the file is a regular
/// file owned by `owner` (the supervisor's uid) that nobody else can read or write.
pub(crate) fn read(run_dir: &Path, owner: u32) -> Result<BTreeMap<String, String>, String> {
    let file = path(run_dir);
    let failed = |e: &dyn std::fmt::Display| format!("reading {}: {e}", file.display());
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&file)
        .map_err(|e| failed(&e))?;
    let meta = f.metadata().map_err(|e| failed(&e))?;
    if !meta.is_file() || meta.uid() != owner || meta.mode() & 0o077 != 0 {
        return Err(failed(&format_args!(
            "must be a regular file owned by uid {owner} with mode 0600 (it is uid {}, mode {:o})",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).map_err(|e| failed(&e))?;
    let parsed: EnvFile = serde_json::from_slice(&bytes).map_err(|e| failed(&e))?;
    if parsed.format != FORMAT {
        return Err(failed(&format_args!(
            "format {} is not {FORMAT}: written by another version of gpu-agent",
            parsed.format
        )));
    }
    Ok(parsed.env)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_supervisor_gets_only_path_lang_and_its_allocators_setting() {
        let names: Vec<_> = SUPERVISOR_ENV.iter().map(|(k, _)| *k).collect();
        assert_eq!(names, ["PATH", "LANG", "_RJEM_MALLOC_CONF"]);
        assert!(SUPERVISOR_ENV.iter().all(|(_, v)| !v.is_empty()));
    }

    #[test]
    fn the_file_round_trips_private_and_whole() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let me = nix::unistd::geteuid().as_raw();
        let env = BTreeMap::from([
            ("SECRET".to_owned(), "s3cr3t \"quoted\"\nline".to_owned()),
            ("EMPTY".to_owned(), String::new()),
        ]);
        write(tmp.path(), &env).expect("write");
        let meta = fs::metadata(path(tmp.path())).expect("file");
        assert_eq!((meta.uid(), meta.mode() & 0o777), (me, 0o600));
        assert_eq!(read(tmp.path(), me).expect("read"), env);
        assert!(!tmp.path().join("env.json.tmp").exists());
        // Rewritten over a stale temporary file (an interrupted earlier write).
        fs::write(tmp.path().join("env.json.tmp"), "junk").expect("stale");
        write(tmp.path(), &BTreeMap::new()).expect("rewrite");
        assert_eq!(read(tmp.path(), me).expect("read"), BTreeMap::new());
    }

    #[test]
    fn a_file_others_could_touch_or_of_another_format_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let me = nix::unistd::geteuid().as_raw();
        let err = read(tmp.path(), me).expect_err("missing");
        assert!(err.contains("env.json"), "{err}");
        write(tmp.path(), &BTreeMap::new()).expect("write");
        let err = read(tmp.path(), me + 1).expect_err("another owner");
        assert!(err.contains("must be a regular file owned by uid"), "{err}");
        fs::set_permissions(path(tmp.path()), fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = read(tmp.path(), me).expect_err("readable by others");
        assert!(err.contains("mode 644"), "{err}");
        fs::remove_file(path(tmp.path())).expect("rm");
        std::os::unix::fs::symlink("/etc/hostname", path(tmp.path())).expect("link");
        assert!(read(tmp.path(), me).is_err(), "a link is never followed");
        fs::remove_file(path(tmp.path())).expect("rm");
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path(tmp.path()))
            .expect("create");
        f.write_all(br#"{"format": 2, "env": {}}"#).expect("write");
        let err = read(tmp.path(), me).expect_err("format 2");
        assert!(err.contains("format 2 is not 1"), "{err}");
    }
}
