//! The leader's kept pending index against one built from the state, over random sequences of
//! submissions, placements, cancels, starts, losses and successes.

use gpu_raft_store::ClusterState;
use proptest::prelude::*;

use super::Ordering;
use super::pending::{PendingCache, PendingIndex, members};
use super::random_history::{job_step, step_command};
use super::testkit::{apply, gpu, node};

proptest! {
    /// Whatever entries are applied, the leader's kept index holds exactly the pending
    /// jobs: those submitted, requeued after a lost run, and not bound or cancelled.
    #[test]
    fn a_cache_kept_between_passes_equals_an_index_built_from_the_state(
        steps in proptest::collection::vec(job_step(), 1..60),
        every in 1usize..5,
    ) {
        let mut state = ClusterState::new();
        node(&mut state, 1, (0..4).map(|i| gpu(i, "A100", 0)).collect());
        let mut cache = PendingCache::default();
        for (n, step) in steps.iter().enumerate() {
            if let Some(cmd) = step_command(&state, step) {
                apply(&mut state, cmd);
            }
            if n % every == 0 {
                let kept = members(cache.get(&state, Ordering::Fcfs));
                prop_assert_eq!(kept, members(&PendingIndex::of(&state, Ordering::Fcfs)));
            }
        }
        let kept = members(cache.get(&state, Ordering::Fcfs));
        prop_assert_eq!(kept, members(&PendingIndex::of(&state, Ordering::Fcfs)));
    }
}
