//! The executor's pure core: compare the placements the cluster wants on this node with the
//! runs the node has, and list what to do. Level-triggered: the same inputs give the same
//! actions, so it converges after any crash or restart.

use gpu_raft_store::{JobId, JobState, Outcome};

use super::job_dir::StopReason;

/// A placement on this node from the replicated state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Desired {
    pub job: JobId,
    pub generation: u64,
    pub state: JobState,
    pub cancel: bool,
    pub evict: bool,
}

/// A run this node knows of, from its job directories.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Observed {
    pub job: JobId,
    pub generation: u64,
    /// The supervisor process is alive.
    pub alive: bool,
    /// The supervisor has not written its pid yet and the directory is young.
    pub starting: bool,
    pub exit: Option<Outcome>,
    pub stop_requested: bool,
    pub reported: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Action {
    Start {
        job: JobId,
        generation: u64,
    },
    Stop {
        job: JobId,
        generation: u64,
        reason: StopReason,
    },
    ReportStarted {
        job: JobId,
        generation: u64,
    },
    ReportFinished {
        job: JobId,
        generation: u64,
        outcome: Outcome,
    },
}

pub(super) fn reconcile(desired: &[Desired], observed: &[Observed]) -> Vec<Action> {
    let mut actions = Vec::new();
    for d in desired {
        let (job, generation) = (d.job, d.generation);
        let run = observed
            .iter()
            .find(|o| o.job == job && o.generation == generation);
        match run {
            None if d.cancel || d.evict => {
                let outcome = if d.cancel {
                    Outcome::Cancelled
                } else {
                    Outcome::Evicted
                };
                actions.push(Action::ReportFinished {
                    job,
                    generation,
                    outcome,
                });
            }
            None if d.state == JobState::Bound => actions.push(Action::Start { job, generation }),
            None => actions.push(Action::ReportFinished {
                job,
                generation,
                outcome: Outcome::Lost {
                    message: "its node has no record of the run".into(),
                },
            }),
            Some(o) if o.reported => {}
            Some(o) => {
                if d.state == JobState::Bound && (o.alive || o.exit.is_some()) {
                    actions.push(Action::ReportStarted { job, generation });
                }
                if let Some(outcome) = &o.exit {
                    actions.push(Action::ReportFinished {
                        job,
                        generation,
                        outcome: outcome.clone(),
                    });
                } else if o.alive && !o.stop_requested && (d.cancel || d.evict) {
                    let reason = if d.cancel {
                        StopReason::Cancel
                    } else {
                        StopReason::Evict
                    };
                    actions.push(Action::Stop {
                        job,
                        generation,
                        reason,
                    });
                } else if !o.alive && !o.starting {
                    actions.push(Action::ReportFinished {
                        job,
                        generation,
                        outcome: Outcome::Lost {
                            message: "its supervisor process died".into(),
                        },
                    });
                }
            }
        }
    }
    for o in observed {
        let wanted = desired
            .iter()
            .any(|d| d.job == o.job && d.generation == o.generation);
        if !wanted && o.alive && !o.stop_requested {
            actions.push(Action::Stop {
                job: o.job,
                generation: o.generation,
                reason: StopReason::Stale,
            });
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desired(state: JobState) -> Desired {
        Desired {
            job: 1,
            generation: 2,
            state,
            cancel: false,
            evict: false,
        }
    }

    fn observed() -> Observed {
        Observed {
            job: 1,
            generation: 2,
            alive: true,
            starting: false,
            exit: None,
            stop_requested: false,
            reported: false,
        }
    }

    #[test]
    fn a_new_binding_starts_once() {
        assert_eq!(
            reconcile(&[desired(JobState::Bound)], &[]),
            vec![Action::Start {
                job: 1,
                generation: 2
            }]
        );
        let starting = Observed {
            alive: false,
            starting: true,
            ..observed()
        };
        assert_eq!(reconcile(&[desired(JobState::Bound)], &[starting]), vec![]);
    }

    #[test]
    fn a_running_process_is_reported_then_its_exit() {
        assert_eq!(
            reconcile(&[desired(JobState::Bound)], &[observed()]),
            vec![Action::ReportStarted {
                job: 1,
                generation: 2
            }]
        );
        assert_eq!(
            reconcile(&[desired(JobState::Running)], &[observed()]),
            vec![]
        );
        let exited = Observed {
            alive: false,
            exit: Some(Outcome::Exited { code: 0 }),
            ..observed()
        };
        assert_eq!(
            reconcile(&[desired(JobState::Running)], std::slice::from_ref(&exited)),
            vec![Action::ReportFinished {
                job: 1,
                generation: 2,
                outcome: Outcome::Exited { code: 0 }
            }]
        );
        let reported = Observed {
            reported: true,
            ..exited
        };
        assert_eq!(
            reconcile(&[desired(JobState::Running)], &[reported]),
            vec![]
        );
    }

    #[test]
    fn a_run_the_cluster_no_longer_wants_is_stopped_once() {
        assert_eq!(
            reconcile(&[], &[observed()]),
            vec![Action::Stop {
                job: 1,
                generation: 2,
                reason: StopReason::Stale
            }]
        );
        let stopping = Observed {
            stop_requested: true,
            ..observed()
        };
        assert_eq!(reconcile(&[], &[stopping]), vec![]);
        let older = Observed {
            generation: 1,
            ..observed()
        };
        let actions = reconcile(&[desired(JobState::Bound)], &[older]);
        assert!(actions.contains(&Action::Stop {
            job: 1,
            generation: 1,
            reason: StopReason::Stale
        }));
        assert!(actions.contains(&Action::Start {
            job: 1,
            generation: 2
        }));
    }

    #[test]
    fn running_after_restart_without_a_record_is_lost_never_restarted() {
        let actions = reconcile(&[desired(JobState::Running)], &[]);
        assert!(matches!(
            actions.as_slice(),
            [Action::ReportFinished {
                outcome: Outcome::Lost { .. },
                ..
            }]
        ));
        let dead = Observed {
            alive: false,
            ..observed()
        };
        let actions = reconcile(&[desired(JobState::Running)], &[dead]);
        assert!(matches!(
            actions.as_slice(),
            [Action::ReportFinished {
                outcome: Outcome::Lost { .. },
                ..
            }]
        ));
    }

    #[test]
    fn cancel_and_evict() {
        let cancel = Desired {
            cancel: true,
            ..desired(JobState::Running)
        };
        assert_eq!(
            reconcile(std::slice::from_ref(&cancel), &[observed()]),
            vec![Action::Stop {
                job: 1,
                generation: 2,
                reason: StopReason::Cancel
            }]
        );
        let not_started = Desired {
            cancel: true,
            ..desired(JobState::Bound)
        };
        assert_eq!(
            reconcile(&[not_started], &[]),
            vec![Action::ReportFinished {
                job: 1,
                generation: 2,
                outcome: Outcome::Cancelled
            }]
        );
        let evict = Desired {
            evict: true,
            ..desired(JobState::Running)
        };
        assert_eq!(
            reconcile(&[evict], &[observed()]),
            vec![Action::Stop {
                job: 1,
                generation: 2,
                reason: StopReason::Evict
            }]
        );
    }
}
