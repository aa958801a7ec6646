//! When to report a live run's phase (pulling its image) through Raft. Pure: the decision from
//! what the supervisor says now, what the replicated state shows, and when this run's phase
//! was last sent. Level-triggered (a restarted agent reports what differs), and never chatty:
//! a phase that begins or ends is reported within a second, a change of its text at most
//! every `TEXT_EVERY`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpu_raft_store::JobId;

/// The least time between two reports of one run's changing phase text.
pub(super) const TEXT_EVERY: Duration = Duration::from_secs(5);
/// The least time between two reports of one run at all (a refused report is not retried in a
/// busy loop).
const ANY_EVERY: Duration = Duration::from_secs(1);

/// When each run's phase was last sent.
#[derive(Debug, Default)]
pub(super) struct PhaseReports {
    sent: HashMap<(JobId, u64), Instant>,
}

impl PhaseReports {
    /// The phase to send now for run `run`, if any (`Some(None)`: the phase is over). `current`
    /// is the supervisor's, `shown` the replicated state's.
    pub(super) fn due(
        &mut self,
        run: (JobId, u64),
        current: Option<&str>,
        shown: Option<&str>,
        now: Instant,
    ) -> Option<Option<String>> {
        if current == shown {
            return None;
        }
        let wait = if current.is_some() && shown.is_some() {
            TEXT_EVERY
        } else {
            ANY_EVERY
        };
        if self
            .sent
            .get(&run)
            .is_some_and(|at| now.saturating_duration_since(*at) < wait)
        {
            return None;
        }
        self.sent.insert(run, now);
        Some(current.map(str::to_owned))
    }

    /// Forget the runs that are not live here any more.
    pub(super) fn retain(&mut self, live: impl Fn(&(JobId, u64)) -> bool) {
        self.sent.retain(|run, _| live(run));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_begins_and_ends_at_once_and_its_text_changes_at_most_every_few_seconds() {
        let mut r = PhaseReports::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let run = (1, 1);
        assert_eq!(r.due(run, None, None, at(0)), None, "nothing to say");
        assert_eq!(
            r.due(run, Some("pulling a"), None, at(0)),
            Some(Some("pulling a".into())),
            "a phase that begins is sent at once"
        );
        // Not yet applied: not sent again within the second.
        assert_eq!(r.due(run, Some("pulling a"), None, at(500)), None);
        assert_eq!(
            r.due(run, Some("pulling b"), Some("pulling a"), at(1_000)),
            None,
            "a new text waits its turn"
        );
        assert_eq!(
            r.due(run, Some("pulling c"), Some("pulling a"), at(5_000)),
            Some(Some("pulling c".into()))
        );
        // Every line of a pull changes the text: one report per TEXT_EVERY, not per line.
        let mut sent = 0;
        for ms in (5_000..65_000).step_by(100) {
            let text = format!("pulling {ms}");
            if r.due(run, Some(&text), Some("pulling c"), at(ms)).is_some() {
                sent += 1;
            }
        }
        assert_eq!(sent, 11, "one per 5 s over a minute");
        assert_eq!(
            r.due(run, None, Some("pulling x"), at(66_000)),
            Some(None),
            "the end of the phase is sent within a second"
        );
        assert_eq!(r.due(run, None, None, at(66_100)), None);
        assert_eq!(
            r.due((2, 1), Some("other run"), None, at(66_100)),
            Some(Some("other run".into())),
            "each run on its own"
        );
        r.retain(|run| run.0 == 2);
        assert_eq!(r.sent.len(), 1);
    }
}
