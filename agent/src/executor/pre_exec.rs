//! What the job's own process does between fork and exec, as root still: enter the run's
//! cgroups (so no process of the job ever runs outside them, not even one it forks at once)
//! and give up the agent's OOM shield. Only async-signal-safe system calls on paths prepared
//! before the fork: the child of a multi-threaded process may not allocate or take locks.
//!
//! Order matters: these hooks are registered before the one that switches to the job's user
//! (`identity::become_in_child`), since a job user may not write `cgroup.procs` nor lower its
//! OOM score.

// `pre_exec` is `unsafe`: its closure runs in the forked child, where only async-signal-safe
// calls are sound. Each closure here makes only such calls (open, write, close).
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use nix::libc;
use tokio::process::Command;

/// The OOM killer's view of a process: the agent sets its own to -1000 (never kill it), which
/// its children inherit; a job goes back to 0.
const OOM_SCORE_ADJ: &CStr = c"/proc/self/oom_score_adj";

/// Make the job write `0` (itself) into each of `procs_files` and reset its OOM score before
/// it execs. A failure to enter a cgroup fails the spawn with that error.
pub(super) fn enter_cgroups(cmd: &mut Command, procs_files: &[PathBuf]) -> Result<(), String> {
    let files = procs_files
        .iter()
        .map(|p| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| format!("{} holds a NUL byte", p.display()))
        })
        .collect::<Result<Vec<CString>, String>>()?;
    let hook = move || {
        for file in &files {
            write_zero(file)?;
        }
        // Only root can have lowered it, and root can raise it again; elsewhere the job keeps
        // what the agent had.
        write_zero(OOM_SCORE_ADJ).ok();
        Ok(())
    };
    // SAFETY: `hook` only calls `write_zero` (open, write, close) on strings built above.
    unsafe {
        cmd.pre_exec(hook);
    }
    Ok(())
}

/// `echo 0 > path` with raw system calls.
fn write_zero(path: &CStr) -> io::Result<()> {
    // SAFETY: `path` is a valid NUL-terminated string; the descriptor is closed before return.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: writes one byte from a static buffer to the descriptor opened above.
    let written = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
    let result = if written < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    };
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    result
}
