//! Random histories of jobs for property tests: a step (submit, place, cancel, start, lose,
//! succeed) and the command it stands for in a given state.

use gpu_raft_store::{ClusterState, Command, Job, Outcome};
use proptest::prelude::*;

use super::plan::plan_default;
use super::testkit::spec;

/// One step of a random history of jobs (`step_command` makes it a command).
#[derive(Clone, Debug)]
pub(crate) enum Step {
    Submit(u32),
    Place,
    Cancel(usize),
    Start(usize),
    Lose(usize),
    Succeed(usize),
}

pub(crate) fn job_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u32..3).prop_map(Step::Submit),
        Just(Step::Place),
        any::<usize>().prop_map(Step::Cancel),
        any::<usize>().prop_map(Step::Start),
        any::<usize>().prop_map(Step::Lose),
        any::<usize>().prop_map(Step::Succeed),
    ]
}

/// The command `step` stands for in `state` (`None` when there is nothing to do it to).
pub(crate) fn step_command(state: &ClusterState, step: &Step) -> Option<Command> {
    let pick = |k: usize| {
        let ids: Vec<&Job> = state.jobs.values().collect();
        (!ids.is_empty()).then(|| ids[k % ids.len()])
    };
    let finish = |k: usize, outcome: Outcome| {
        pick(k).map(|j| Command::JobFinished {
            job: j.id,
            generation: j.generation,
            outcome,
        })
    };
    match *step {
        Step::Submit(gpus) => {
            let mut spec = spec(gpus, 0);
            spec.max_attempts = 3;
            Some(Command::submit(spec))
        }
        Step::Place => {
            let binds = plan_default(state).binds;
            (!binds.is_empty()).then_some(Command::BindJobs { binds })
        }
        Step::Cancel(k) => pick(k).map(|j| Command::CancelJob { job: j.id }),
        Step::Start(k) => pick(k).map(|j| Command::JobStarted {
            job: j.id,
            generation: j.generation,
        }),
        Step::Lose(k) => finish(
            k,
            Outcome::Lost {
                message: "node down".into(),
            },
        ),
        Step::Succeed(k) => finish(k, Outcome::Exited { code: 0 }),
    }
}
