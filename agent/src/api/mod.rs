//! The gRPC edge: one file per public service, the internal peer service, authentication, the
//! one error → status mapping (`status.rs`) and the one wire ↔ domain conversion (`to_proto.rs`,
//! `from_proto.rs`). Nothing below this layer builds a `tonic::Status` or a generated type.

pub(crate) mod alert;
pub(crate) mod audit;
pub mod auth;
pub(crate) mod cert;
mod cert_ca;
pub(crate) mod cluster;
pub mod from_proto;
pub(crate) mod gpu;
mod image;
pub(crate) mod job;
mod job_filter;
mod job_list;
pub(crate) mod job_watch;
mod leader_route;
mod log_target;
pub(crate) mod logs;
pub(crate) mod node;
mod node_remove;
pub(crate) mod peer;
pub(crate) mod scheduler;
pub(crate) mod status;
pub(crate) mod tenant;
pub(crate) mod to_proto;
pub(crate) mod token;
