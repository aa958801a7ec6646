//! The replicated state (`ClusterState`), the log vocabulary it applies (`Command`), and each
//! domain's records and rules. Pure: no I/O, no clock, nothing of openraft's storage.

pub(crate) mod account;
pub mod alert;
pub(crate) mod apply;
pub(crate) mod array;
pub mod audit;
pub mod auth;
pub mod ca;
pub mod cert;
pub(crate) mod command;
pub mod container;
pub(crate) mod dependency;
pub mod digest;
pub mod energy;
pub mod job;
pub(crate) mod job_log;
pub(crate) mod job_update;
pub(crate) mod kept_index;
pub mod mig;
pub mod node;
pub(crate) mod outcome;
pub mod partition;
mod provenance;
pub mod registry;
pub mod requests;
pub mod retention;
pub mod scheduler;
pub(crate) mod shared_map;
pub mod slice_fit;
pub(crate) mod state;
pub mod tenant;
pub(crate) mod topology;
pub mod validate;
pub mod webhook;
