//! openraft 0.9 storage on sled: the log store, the state machine, snapshot and backup files,
//! and opening a data directory.

pub mod archive;
pub mod backup;
pub(crate) mod engine;
pub(crate) mod error;
pub(crate) mod format;
mod log_flush;
pub(crate) mod log_store;
mod record_file;
mod replace_file;
mod slot_file;
mod snapshot_file;
mod snapshot_gate;
pub(crate) mod state_machine;
pub(crate) mod store;
