//! This host as the agent sees it: the inventory it reports, `/proc` parsing, and systemd's
//! readiness and watchdog protocol.

pub(crate) mod inventory;
pub mod proc_stat;
pub(crate) mod sd_notify;
pub(crate) mod watchdog;
