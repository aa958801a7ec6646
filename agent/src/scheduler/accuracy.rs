//! How good the runtimes the scheduler plans with were, in production: for every succeeded
//! job the state still holds, the user's estimate (when it gave one) and the prediction the
//! history made when the job started (from the jobs that had succeeded by then, as the leader's
//! history had them), each against how long the job really ran.

use gpu_raft_store::{ClusterState, JobState};

use super::history::RuntimeHistory;

/// Estimates and predictions against actual runtimes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Accuracy {
    /// Succeeded jobs looked at.
    pub jobs: usize,
    /// Users' own runtime estimates.
    pub estimates: Errors,
    /// The history's predictions (for every job, whether or not it had an estimate).
    pub predictions: Errors,
}

/// The errors of one kind of guess.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Errors {
    /// Jobs that had a guess of this kind.
    pub count: usize,
    /// Median of |guess − actual| / actual.
    pub median_relative_error: f64,
    /// Share of guesses within a factor of two of the actual runtime.
    pub within_2x: f64,
}

/// The accuracy of the estimates and predictions of the succeeded jobs in `state`.
pub fn accuracy(state: &ClusterState) -> Accuracy {
    // (start, end, job): each job is predicted from the jobs that ended before it started.
    let mut runs: Vec<(u64, u64, &gpu_raft_store::Job)> = state
        .jobs
        .values()
        .filter(|j| j.state == JobState::Succeeded)
        .filter_map(|j| Some((j.started_at_ms?, j.finished_at_ms?, j)))
        .filter(|(start, end, _)| end > start)
        .collect();
    let mut by_end: Vec<usize> = (0..runs.len()).collect();
    runs.sort_by_key(|(start, _, j)| (*start, j.id));
    by_end.sort_by_key(|&i| (runs[i].1, runs[i].2.id));
    let mut history = RuntimeHistory::default();
    let mut ended = 0;
    // guess / actual, per job.
    let (mut estimate_ratios, mut prediction_ratios) = (Vec::new(), Vec::new());
    for &(start, end, job) in &runs {
        while ended < by_end.len() && runs[by_end[ended]].1 <= start {
            let (s, e, done) = runs[by_end[ended]];
            history.record(&done.spec, e - s);
            ended += 1;
        }
        let actual = (end - start) as f64;
        if let Some(estimate_s) = job.spec.runtime_estimate_s {
            estimate_ratios.push(estimate_s as f64 * 1000.0 / actual);
        }
        if let Some(predicted) = history.predict_ms(&job.spec) {
            prediction_ratios.push(predicted as f64 / actual);
        }
    }
    Accuracy {
        jobs: runs.len(),
        estimates: errors(&estimate_ratios),
        predictions: errors(&prediction_ratios),
    }
}

/// The errors of guesses given as guess / actual ratios.
fn errors(ratios: &[f64]) -> Errors {
    if ratios.is_empty() {
        return Errors::default();
    }
    let mut relative: Vec<f64> = ratios.iter().map(|r| (r - 1.0).abs()).collect();
    relative.sort_by(f64::total_cmp);
    let within = ratios.iter().filter(|r| (0.5..=2.0).contains(*r)).count();
    Errors {
        count: ratios.len(),
        median_relative_error: relative[relative.len() / 2],
        within_2x: within as f64 / ratios.len() as f64,
    }
}

#[cfg(test)]
mod tests {
    use gpu_raft_store::{Command, JobSpec, Outcome};

    use super::*;
    use crate::scheduler::testkit::{apply_at, gpu, node, spec, submit_at};

    /// Submit, bind, start and finish a job of `name` running from `start` s to `end` s.
    fn ran(s: &mut ClusterState, name: &str, estimate_s: Option<u64>, start: u64, end: u64) {
        let id = s.next_job_id;
        let spec = JobSpec {
            name: name.into(),
            runtime_estimate_s: estimate_s,
            ..spec(1, 0)
        };
        submit_at(s, start * 1000, spec);
        let bind = gpu_raft_store::Bind {
            job: id,
            node: 1,
            gpus: vec![0],
        };
        apply_at(s, start * 1000, Command::BindJobs { binds: vec![bind] });
        let generation = s.jobs[&id].generation;
        apply_at(
            s,
            start * 1000,
            Command::JobStarted {
                job: id,
                generation,
            },
        );
        let outcome = Outcome::Exited { code: 0 };
        apply_at(
            s,
            end * 1000,
            Command::JobFinished {
                job: id,
                generation,
                outcome,
            },
        );
        assert_eq!(s.jobs[&id].state, JobState::Succeeded, "{:?}", s.jobs[&id]);
    }

    #[test]
    fn each_job_is_judged_by_what_was_known_when_it_started() {
        let mut s = ClusterState::new();
        node(&mut s, 1, vec![gpu(0, "A100", 0)]);
        // "train" runs 100 s, then 100 s again (predicted from the first: exact), then 400 s
        // (predicted 100: a relative error of 0.75, outside 2x). Its user guessed 100 s each
        // time.
        ran(&mut s, "train", Some(100), 0, 100);
        ran(&mut s, "train", Some(100), 100, 200);
        ran(&mut s, "train", Some(100), 200, 600);
        let a = accuracy(&s);
        assert_eq!(a.jobs, 3);
        assert_eq!(a.predictions.count, 2, "the first run had no history");
        assert_eq!(a.predictions.median_relative_error, 0.75);
        assert_eq!(a.predictions.within_2x, 0.5);
        assert_eq!(a.estimates.count, 3);
        assert_eq!(a.estimates.median_relative_error, 0.0);
        assert!((a.estimates.within_2x - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(accuracy(&ClusterState::new()), Accuracy::default());
    }
}
