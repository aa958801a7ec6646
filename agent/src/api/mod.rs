//! The gRPC edge: one file per public service, the internal peer service, authentication, the
//! one error → status mapping (`status.rs`) and the one wire ↔ domain conversion (`to_proto.rs`,
//! `from_proto.rs`). Nothing below this layer builds a `tonic::Status` or a generated type.

pub mod alert;
pub mod audit;
pub mod auth;
pub mod cert;
pub mod cluster;
pub mod from_proto;
pub mod gpu;
pub mod job;
pub mod logs;
pub mod node;
pub mod peer;
pub mod router;
pub mod scheduler;
pub mod status;
pub mod tenant;
pub mod to_proto;
pub mod token;
