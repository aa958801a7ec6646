//! Jobs of kind `vm`: no process runs. The job's pass-through GPUs are handed to a virtual
//! machine by PCI address, and the run lasts until it is cancelled, evicted or reaches its wall
//! limit.
//!
//! **Hypervisor integration point.** [`attach`] and [`detach`] are where a hypervisor hook
//! belongs: `attach` would bind each PCI function to `vfio-pci` and start (or hot-plug into) the
//! tenant's VM, e.g. `virsh attach-device` with a `<hostdev>` per address; `detach` would stop
//! the VM and give the functions back to the host driver. This build has no hypervisor, so the
//! attachment is only recorded: the job directory holds `vm` (one PCI address a line) and the
//! job's stdout says which addresses it was given (`gpuctl job logs`). The rest of the executor
//! treats a vm run like any other: it is level-triggered on the files in its job directory.

use std::io::Write;

use gpu_raft_store::{Job, Outcome};

use super::job_dir::JobDir;

/// The file in a job directory that marks a vm run and lists its PCI addresses.
const VM_FILE: &str = "vm";

/// Record the pass-through of `pci` to the job's VM (see the integration point above).
pub(super) fn attach(dir: &JobDir, pci: &[String]) -> std::io::Result<()> {
    dir.create()?;
    // Hypervisor hook: hand `pci` to the VM here; on failure return the error and the run
    // fails to start (the caller reports `FailedToStart`).
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.stdout())?;
    writeln!(out, "vm: pass-through GPUs at {}", pci.join(" "))?;
    let tmp = dir.path.join(format!("{VM_FILE}.tmp"));
    std::fs::write(
        &tmp,
        pci.iter().map(|p| format!("{p}\n")).collect::<String>(),
    )?;
    std::fs::rename(tmp, dir.path.join(VM_FILE))
}

/// Whether this directory is a vm run.
pub(super) fn is_vm(dir: &JobDir) -> bool {
    dir.path.join(VM_FILE).exists()
}

/// End a vm run with `outcome` (hypervisor hook: stop the VM, release the functions).
pub(super) fn detach(dir: &JobDir, outcome: &Outcome) -> std::io::Result<()> {
    if dir.exit().is_some() {
        return Ok(());
    }
    dir.write_exit(outcome)
}

/// Whether a started vm job has run past its wall limit at `now_ms`.
pub(super) fn past_wall_limit(job: &Job, now_ms: u64) -> bool {
    match (job.started_at_ms, job.spec.wall_time_limit_s) {
        (Some(start), Some(limit)) => now_ms >= start.saturating_add(limit.saturating_mul(1000)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_run_records_its_addresses_and_ends_once() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = JobDir::new(root.path(), 7, 1);
        assert!(!is_vm(&dir));
        let pci = vec!["00000000:17:00.0".to_owned(), "00000000:31:00.0".to_owned()];
        attach(&dir, &pci).expect("attach");
        assert!(is_vm(&dir));
        let recorded = std::fs::read_to_string(dir.path.join(VM_FILE)).expect("vm file");
        assert_eq!(recorded, "00000000:17:00.0\n00000000:31:00.0\n");
        let log = std::fs::read_to_string(dir.stdout()).expect("stdout");
        assert_eq!(
            log,
            "vm: pass-through GPUs at 00000000:17:00.0 00000000:31:00.0\n"
        );
        assert_eq!(dir.exit(), None);
        detach(&dir, &Outcome::Cancelled).expect("detach");
        detach(&dir, &Outcome::WallTimeExceeded).expect("second detach is a no-op");
        assert_eq!(dir.exit(), Some(Outcome::Cancelled));
    }
}
