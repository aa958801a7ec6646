//! Tasks that act only while this agent leads: the scheduling loop, autopilot (voter
//! replacement, dead member removal) and node liveness verdicts.

pub(crate) mod autopilot;
pub(crate) mod liveness;
pub(crate) mod scheduler_loop;
pub(crate) mod ticks;
