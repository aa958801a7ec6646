//! Which data directory a jobs directory belongs to.
//!
//! Runs are named by job id and generation, which start again at 1 in a new cluster. The jobs
//! directory lives beside the data directory, not inside it, so it survives the data directory
//! being wiped (to rebuild a node or a cluster): the new cluster's `j-1-g1` would then find an
//! old run of that name, already ended and reported, and never start. Two agents given one
//! `jobs.dir` would likewise take each other's runs for stale ones and stop them.
//!
//! So the data directory holds a random id (`jobs-owner`) and the jobs directory a copy
//! (`.owner`). At start an agent claims an unowned jobs directory (runs from versions that kept
//! no owner are adopted); runs left by another data directory are set aside in
//! `foreign-<id>/`, where the executor never looks, unless one of them is still running: then
//! the agent refuses to start, since another agent may be using the directory.

use std::fs;
use std::path::{Path, PathBuf};

use super::job_dir::JobDir;

const DATA_FILE: &str = "jobs-owner";
const JOBS_FILE: &str = ".owner";

/// What to do with a jobs directory owned by `theirs`, for the data directory `ours`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nobody owns it yet: take it (its runs, from an earlier version, with it).
    Claim,
    Ours,
    /// Another data directory's: set its runs aside.
    SetAside {
        theirs: String,
    },
    /// Another data directory's, with a run still going: leave everything as it is.
    Refuse {
        theirs: String,
    },
}

/// Pure: the verdict on a jobs directory.
pub(crate) fn judge(ours: &str, theirs: Option<&str>, any_running: bool) -> Verdict {
    match theirs {
        None => Verdict::Claim,
        Some(t) if t == ours => Verdict::Ours,
        Some(t) if any_running => Verdict::Refuse {
            theirs: t.to_owned(),
        },
        Some(t) => Verdict::SetAside {
            theirs: t.to_owned(),
        },
    }
}

/// What `claim` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Claimed {
    Ours,
    /// Runs of another data directory were moved to this directory.
    SetAside {
        runs: usize,
        to: PathBuf,
    },
}

/// Make `jobs_dir` this data directory's, as `judge` says; `Err` with the reason when the agent
/// must not use it.
pub(crate) fn claim(jobs_dir: &Path, data_dir: &Path) -> Result<Claimed, String> {
    let io = |what: &str, path: &Path, e: std::io::Error| format!("{what} {}: {e}", path.display());
    let ours = data_id(data_dir)?;
    let owner_file = jobs_dir.join(JOBS_FILE);
    let theirs = fs::read_to_string(&owner_file)
        .ok()
        .map(|t| t.trim().to_owned());
    let runs = JobDir::scan(jobs_dir).map_err(|e| io("reading", jobs_dir, e))?;
    let running = || {
        runs.iter()
            .any(|r| r.supervisor().is_some_and(|s| s.is_running()))
    };
    let verdict = judge(&ours, theirs.as_deref(), theirs.is_some() && running());
    let claimed = match verdict {
        Verdict::Ours => return Ok(Claimed::Ours),
        Verdict::Claim => Claimed::Ours,
        Verdict::Refuse { theirs } => {
            return Err(format!(
                "the jobs directory {} belongs to another data directory (owner {theirs}, this one {ours}) and has a run still going: is another agent using it? Give each agent its own jobs.dir",
                jobs_dir.display()
            ));
        }
        Verdict::SetAside { theirs } => {
            let aside = jobs_dir.join(format!("foreign-{theirs}"));
            fs::create_dir_all(&aside).map_err(|e| io("creating", &aside, e))?;
            for run in &runs {
                let name = run.path.file_name().unwrap_or_default();
                fs::rename(&run.path, aside.join(name))
                    .map_err(|e| io("setting aside", &run.path, e))?;
            }
            Claimed::SetAside {
                runs: runs.len(),
                to: aside,
            }
        }
    };
    fs::write(&owner_file, format!("{ours}\n")).map_err(|e| io("writing", &owner_file, e))?;
    Ok(claimed)
}

/// The data directory's id, made on first use.
fn data_id(data_dir: &Path) -> Result<String, String> {
    let path = data_dir.join(DATA_FILE);
    if let Ok(text) = fs::read_to_string(&path)
        && !text.trim().is_empty()
    {
        return Ok(text.trim().to_owned());
    }
    let id = format!("{:032x}", rand::random::<u128>());
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, format!("{id}\n"))
        .and_then(|()| fs::rename(&tmp, &path))
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::job_dir::Supervisor;

    #[test]
    fn the_verdicts() {
        assert_eq!(judge("a", None, true), Verdict::Claim);
        assert_eq!(judge("a", Some("a"), true), Verdict::Ours);
        assert_eq!(
            judge("a", Some("b"), false),
            Verdict::SetAside { theirs: "b".into() }
        );
        assert_eq!(
            judge("a", Some("b"), true),
            Verdict::Refuse { theirs: "b".into() }
        );
    }

    #[test]
    fn a_wiped_data_directory_does_not_inherit_the_old_runs() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (data, jobs) = (tmp.path().join("d"), tmp.path().join("d-jobs"));
        fs::create_dir_all(&data).expect("data");
        let old = JobDir::new(&jobs, 1, 1);
        old.create().expect("run");
        // First start: an unowned directory (an earlier version's) is claimed with its runs.
        assert_eq!(claim(&jobs, &data), Ok(Claimed::Ours));
        assert_eq!(claim(&jobs, &data), Ok(Claimed::Ours));
        assert!(old.path.exists());
        // The data directory is wiped: the old runs are set aside.
        fs::remove_dir_all(&data).expect("wipe");
        fs::create_dir_all(&data).expect("data");
        let Ok(Claimed::SetAside { runs: 1, to }) = claim(&jobs, &data) else {
            panic!("not set aside");
        };
        assert!(to.join("j-1-g1").is_dir() && !old.path.exists());
        assert_eq!(JobDir::scan(&jobs).expect("scan"), vec![]);
        assert_eq!(claim(&jobs, &data), Ok(Claimed::Ours));
        // Another agent's directory with a live run: refused, nothing moved.
        let live = JobDir::new(&jobs, 2, 1);
        live.create().expect("run");
        live.write_supervisor(&Supervisor::current().expect("me"))
            .expect("pid");
        let other = tmp.path().join("other");
        fs::create_dir_all(&other).expect("other");
        let err = claim(&jobs, &other).expect_err("in use");
        assert!(err.contains("another agent"), "{err}");
        assert!(live.path.exists());
    }
}
