//! The scheduler: a pure planner (`plan`, driven by a `Policy` and a `PlanEnv` carrying "now")
//! shared by the leader's loop (`leader/scheduler_loop.rs`) and the offline simulator. Apply re-validates every placement, so
//! a stale plan can only lose, never double-book.

mod accuracy;
mod backfill;
mod env;
mod explain;
#[cfg(test)]
mod gang_tests;
#[cfg(test)]
mod gang_wait_tests;
#[cfg(test)]
mod gate_tests;
mod history;
#[cfg(test)]
mod image_locality_tests;
mod learned;
mod order;
#[cfg(test)]
mod order_tests;
mod pending;
#[cfg(test)]
mod pending_tests;
mod placement;
mod plan;
#[cfg(test)]
mod plan_tests;
mod policy;
#[cfg(test)]
mod policy_tests;
mod preempt;
#[cfg(test)]
mod preempt_tests;
mod quota;
#[cfg(test)]
mod quota_tests;
#[cfg(test)]
pub(crate) mod random_history;
mod reslice;
mod retry;
#[cfg(test)]
mod slice_tests;
mod slices;
#[cfg(test)]
pub(crate) mod testkit;
#[cfg(test)]
mod topology_tests;
mod usage;

pub use accuracy::{Accuracy, Errors, accuracy};
pub use backfill::Reservation;
pub(crate) use env::EnvCache;
pub use env::PlanEnv;
pub use explain::{Explanation, explain, planning_copy};
pub use history::RuntimeHistory;
pub use learned::{LearnedWeights, parse as parse_learned_weights};
pub(crate) use pending::PendingCache;
pub use pending::PendingIndex;
pub use plan::{Plan, plan, plan_pending};
pub use policy::{Backfill, BadPolicy, DEFAULT_HALF_LIFE_MS, Ordering, Policy};
pub use preempt::preemptions;
pub use reslice::{Reslice, reslice};
pub use usage::TenantUsage;
