//! Tasks that act only while this agent leads: the scheduling loop, autopilot (voter
//! replacement, dead member removal) and node liveness verdicts.

pub mod autopilot;
pub mod liveness;
pub mod scheduler_loop;
