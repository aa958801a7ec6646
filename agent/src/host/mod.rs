//! This host as the agent sees it: the inventory it reports, `/proc` parsing, and systemd's
//! readiness and watchdog protocol.

pub mod inventory;
pub mod proc_stat;
pub mod sd_notify;
pub mod watchdog;
