//! Tasks that act only while this agent leads: the scheduling loop, autopilot (voter
//! replacement, dead member removal), node liveness verdicts, the audit head's signature,
//! forgetting expired records and archiving old ones.

pub(crate) mod archiver;
pub(crate) mod audit_signer;
pub(crate) mod autopilot;
pub(crate) mod expiry;
pub(crate) mod liveness;
pub(crate) mod scheduler_loop;
pub(crate) mod ticks;
