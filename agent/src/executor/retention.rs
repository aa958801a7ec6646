//! Removing run directories once nothing needs them: a run that has ended, whose placement the
//! cluster has moved past (its outcome was recorded, or the job was requeued, cancelled or
//! finished without it), `jobs.keep_finished_runs` after it was reported (or ended). Never a
//! live run, never one whose outcome the cluster still waits for.
//!
//! "Moved past" is read from the replicated state, not from the `reported` marker alone: the
//! marker may be missing (it could not be written on a full disk, or the run went stale while
//! its node was away), and a gang member that exited 0 is marked reported while its job is still
//! running at that generation. A run whose job the local replica does not know, or knows only
//! at an older generation, is kept: the replica may be behind.
//!
//! A sweep runs on a slow timer and costs one `stat` per run that is not yet old enough, so a
//! directory of thousands of runs is cheap. A run is renamed out of the executor's sight
//! (`.removing-…`) before it is deleted, so a deletion that fails half-way never leaves
//! something that looks like a run; the next sweep finishes it.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use gpu_raft_store::{ClusterState, JobId};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::job_dir::JobDir;
use super::vm;
use crate::raft::Cluster;

/// A supervisor still in start-up may take this long to write its pid (as in `observe.rs`).
const START_GRACE: Duration = Duration::from_secs(10);
const REMOVING: &str = ".removing-";

/// What the replicated state says of a run (job, generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// The job is live at this generation: the run may still be reported, or is still part of
    /// a running gang.
    Current,
    /// The job has ended or moved to a later generation: nothing will be reported of this run.
    Past,
    /// Unknown job, or known only at an older generation: this replica may be behind.
    Unknown,
}

/// Pure: how the state stands towards run `generation` of `job`.
pub(crate) fn standing(state: &ClusterState, job: JobId, generation: u64) -> Standing {
    match state.jobs.get(&job) {
        None => Standing::Unknown,
        Some(j) if j.generation < generation => Standing::Unknown,
        Some(j) if j.generation == generation && j.state.is_live() => Standing::Current,
        Some(_) => Standing::Past,
    }
}

/// Pure: a run directory is removed when its run has ended, the cluster has moved past it, and
/// it has been settled for `keep`.
pub(crate) fn should_remove(
    ended: bool,
    standing: Standing,
    settled_for: Duration,
    keep: Duration,
) -> bool {
    ended && standing == Standing::Past && settled_for >= keep
}

/// How often to sweep: often enough that a run outlives `keep` by little, rarely enough to
/// cost nothing.
pub(crate) fn sweep_every(keep: Duration) -> Duration {
    (keep / 8).clamp(Duration::from_secs(1), Duration::from_secs(600))
}

/// The retention task: one per agent, started beside the executor.
pub struct Retention {
    pub cluster: Cluster,
    pub jobs_dir: PathBuf,
    pub keep: Duration,
}

impl Retention {
    pub async fn run(self, cancel: CancellationToken) {
        let every = sweep_every(self.keep);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let old = {
                let (dir, keep) = (self.jobs_dir.clone(), self.keep);
                match tokio::task::spawn_blocking(move || old_enough(&dir, keep)).await {
                    Ok(Ok(old)) => old,
                    Ok(Err(e)) => {
                        warn!(error = %e, dir = %self.jobs_dir.display(), "cannot read the jobs directory");
                        continue;
                    }
                    Err(_) => continue,
                }
            };
            let past: Vec<JobDir> = self.cluster.state.read(|s| {
                old.into_iter()
                    .filter(|d| standing(s, d.job, d.generation) == Standing::Past)
                    .collect()
            });
            let (dir, keep) = (self.jobs_dir.clone(), self.keep);
            let removed = tokio::task::spawn_blocking(move || remove_ended(&dir, past, keep)).await;
            if let Ok(n) = removed
                && n > 0
            {
                info!(runs = n, keep = ?self.keep, "removed run directories past jobs.keep_finished_runs");
            }
        }
    }
}

/// The runs settled for at least `keep`, by the cheapest test first (one `stat` each).
fn old_enough(jobs_dir: &Path, keep: Duration) -> std::io::Result<Vec<JobDir>> {
    let now = SystemTime::now();
    Ok(JobDir::scan(jobs_dir)?
        .into_iter()
        .filter(|d| settled_for(d, now) >= keep)
        .collect())
}

/// Remove those of `runs` that have ended (checked again, just before), and finish removals an
/// earlier sweep left half done. Returns how many runs were removed.
fn remove_ended(jobs_dir: &Path, runs: Vec<JobDir>, keep: Duration) -> usize {
    let now = SystemTime::now();
    let mut removed = 0;
    for run in runs {
        if !should_remove(
            has_ended(&run),
            Standing::Past,
            settled_for(&run, now),
            keep,
        ) {
            continue;
        }
        let aside = jobs_dir.join(format!(
            "{REMOVING}{}",
            run.path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        ));
        match fs::rename(&run.path, &aside).and_then(|()| fs::remove_dir_all(&aside)) {
            Ok(()) => {
                debug!(
                    job_id = run.job,
                    generation = run.generation,
                    "removed the run directory"
                );
                removed += 1;
            }
            Err(e) => warn!(
                job_id = run.job,
                generation = run.generation,
                error = %e,
                "cannot remove the run directory"
            ),
        }
    }
    finish_removals(jobs_dir);
    removed
}

/// Directories set aside by a sweep whose deletion failed part-way.
fn finish_removals(jobs_dir: &Path) {
    let Ok(entries) = fs::read_dir(jobs_dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(REMOVING)
            && let Err(e) = fs::remove_dir_all(entry.path())
        {
            warn!(dir = %entry.path().display(), error = %e, "cannot remove a run directory set aside");
        }
    }
}

/// How long ago the run was settled: when it was marked reported, or else when its outcome was
/// written, or else when its directory last changed.
fn settled_for(run: &JobDir, now: SystemTime) -> Duration {
    let modified = |p: PathBuf| fs::metadata(p).and_then(|m| m.modified()).ok();
    let at = modified(run.path.join("reported"))
        .or_else(|| {
            run.exit()
                .and_then(|_| modified(run.path.join("exit.json")))
        })
        .or_else(|| modified(run.path.clone()));
    at.and_then(|t| now.duration_since(t).ok())
        .unwrap_or_default()
}

/// The run's process is gone (or, for a vm run, its end is recorded).
fn has_ended(run: &JobDir) -> bool {
    if vm::is_vm(run) {
        return run.exit().is_some();
    }
    match run.supervisor() {
        Some(s) => !s.is_running(),
        None => run.exit().is_some() || run.age() >= START_GRACE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::job_dir::Supervisor;
    use crate::scheduler::testkit::{gpu, node, spec, submit};

    #[test]
    fn only_ended_runs_the_cluster_moved_past_and_kept_long_enough_go() {
        let keep = Duration::from_secs(60);
        let old = Duration::from_secs(61);
        assert!(should_remove(true, Standing::Past, old, keep));
        assert!(should_remove(true, Standing::Past, keep, keep));
        assert!(
            !should_remove(false, Standing::Past, old, keep),
            "still running"
        );
        assert!(
            !should_remove(true, Standing::Current, old, keep),
            "not settled"
        );
        assert!(
            !should_remove(true, Standing::Unknown, old, keep),
            "replica behind"
        );
        assert!(
            !should_remove(true, Standing::Past, Duration::from_secs(59), keep),
            "too young"
        );
        assert_eq!(
            sweep_every(Duration::from_secs(7 * 86_400)),
            Duration::from_secs(600)
        );
        assert_eq!(sweep_every(Duration::from_secs(2)), Duration::from_secs(1));
    }

    #[test]
    fn the_state_says_whether_a_run_is_past() {
        let mut state = ClusterState::new();
        node(&mut state, 1, vec![gpu(0, "A100", 0)]);
        submit(&mut state, spec(1, 0));
        let id = *state.jobs.keys().next().expect("job");
        assert_eq!(standing(&state, id, 1), Standing::Unknown, "not bound yet");
        assert_eq!(
            standing(&state, id + 1, 1),
            Standing::Unknown,
            "unknown job"
        );
        let mut job = state.jobs[&id].clone();
        job.generation = 1;
        job.state = gpu_raft_store::JobState::Running;
        state.jobs.insert(id, job.clone());
        assert_eq!(standing(&state, id, 1), Standing::Current);
        job.state = gpu_raft_store::JobState::Succeeded;
        state.jobs.insert(id, job.clone());
        assert_eq!(standing(&state, id, 1), Standing::Past);
        job.generation = 2;
        job.state = gpu_raft_store::JobState::Running;
        state.jobs.insert(id, job);
        assert_eq!(standing(&state, id, 1), Standing::Past, "requeued");
    }

    /// The `reported` marker may fail to be written (a full disk): the run is then reported
    /// again only while its job still wants it, the cluster ignores the repeat, and once the
    /// job has moved on the run counts as settled for retention all the same.
    #[test]
    fn a_missing_reported_marker_only_repeats_a_report() {
        use gpu_raft_store::{ApplyResult, Bind, Command, JobState, Outcome};

        use crate::executor::reconcile::{Action, Desired, Observed, reconcile};
        use crate::scheduler::testkit::apply;

        let mut state = ClusterState::new();
        node(&mut state, 1, vec![gpu(0, "A100", 0)]);
        submit(&mut state, spec(1, 0));
        let job = *state.jobs.keys().next().expect("job");
        let bind = Command::BindJobs {
            binds: vec![Bind {
                job,
                node: 1,
                gpus: vec![0],
            }],
        };
        assert!(
            matches!(apply(&mut state, bind), ApplyResult::Bound { rejected, .. } if rejected.is_empty())
        );
        assert_eq!(
            apply(&mut state, Command::JobStarted { job, generation: 1 }),
            ApplyResult::Ok
        );
        let ended = Observed {
            job,
            generation: 1,
            alive: false,
            starting: false,
            exit: Some(Outcome::Exited { code: 0 }),
            stop_requested: false,
            reported: false,
        };
        let desired = |s: &ClusterState| -> Vec<Desired> {
            s.jobs
                .values()
                .filter(|j| j.state.is_live())
                .map(|j| Desired {
                    job: j.id,
                    generation: j.generation,
                    state: j.state,
                    cancel: false,
                    evict: false,
                })
                .collect()
        };
        let finished = Command::JobFinished {
            job,
            generation: 1,
            outcome: Outcome::Exited { code: 0 },
        };
        let report = Action::ReportFinished {
            job,
            generation: 1,
            outcome: Outcome::Exited { code: 0 },
        };
        assert_eq!(
            reconcile(&desired(&state), std::slice::from_ref(&ended)),
            vec![report]
        );
        assert_eq!(apply(&mut state, finished.clone()), ApplyResult::Ok);
        assert_eq!(state.jobs[&job].state, JobState::Succeeded);
        // The marker could not be written: the job is no longer wanted, nothing is repeated; a
        // repeat that raced with the apply is rejected as stale, which the executor counts as
        // settled.
        assert_eq!(reconcile(&desired(&state), &[ended]), vec![]);
        assert!(matches!(
            apply(&mut state, finished),
            ApplyResult::Rejected {
                reason: gpu_raft_store::Rejection::Stale { .. }
            }
        ));
        assert_eq!(state.jobs[&job].state, JobState::Succeeded, "unchanged");
        assert_eq!(standing(&state, job, 1), Standing::Past);
    }

    /// A sweep over many runs that are not old enough yet costs one `stat` each.
    #[test]
    fn a_sweep_over_thousands_of_runs_is_cheap() {
        let tmp = tempfile::tempdir().expect("tempdir");
        for job in 0..5000 {
            let d = JobDir::new(tmp.path(), job, 1);
            d.create().expect("create");
            d.mark_reported().expect("reported");
        }
        let started = std::time::Instant::now();
        let old = old_enough(tmp.path(), Duration::from_secs(3600)).expect("scan");
        let took = started.elapsed();
        eprintln!("a sweep over 5000 runs took {took:?}");
        assert!(old.is_empty());
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn a_sweep_removes_ended_runs_and_keeps_running_ones() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let ended = JobDir::new(tmp.path(), 1, 1);
        ended.create().expect("create");
        ended
            .write_exit(&gpu_raft_store::Outcome::Exited { code: 0 })
            .expect("exit");
        ended.mark_reported().expect("reported");
        let running = JobDir::new(tmp.path(), 2, 1);
        running.create().expect("create");
        running
            .write_supervisor(&Supervisor::current().expect("me"))
            .expect("pid");
        // Left half-removed by an earlier sweep.
        fs::create_dir_all(tmp.path().join(".removing-j-3-g1/work")).expect("aside");
        let runs = old_enough(tmp.path(), Duration::ZERO).expect("scan");
        assert_eq!(runs.len(), 2);
        assert_eq!(remove_ended(tmp.path(), runs, Duration::ZERO), 1);
        let left: Vec<_> = fs::read_dir(tmp.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left, ["j-2-g1"]);
        assert!(
            old_enough(tmp.path(), Duration::from_secs(3600))
                .expect("scan")
                .is_empty()
        );
    }
}
