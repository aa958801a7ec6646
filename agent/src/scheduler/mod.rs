//! The scheduler: a pure planner (`plan`) and the leader-only loop that proposes its
//! placements. Apply re-validates every placement, so a stale plan can only lose, never
//! double-book.

mod leader_loop;
mod plan;

pub use leader_loop::Scheduler;
pub use plan::{Plan, Policy, plan};
