//! This host as the agent sees it: the inventory it reports, the container images it holds,
//! `/proc` parsing, and systemd's readiness and watchdog protocol.

pub mod images;
pub(crate) mod inventory;
pub mod proc_stat;
pub(crate) mod sd_notify;
pub(crate) mod watchdog;
