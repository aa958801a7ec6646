//! gpu-agent: the daemon every GPU host runs. It serves the public `gpumesh.v1` API and the
//! internal peer API, takes part in the Raft group, and (as leader) schedules and keeps the
//! membership healthy. `daemon::run` starts everything; the folders are its layers, from the
//! gRPC edge (`api/`) down to the host (`gpu/`, `host/`).
//!
//! Architecture invariant: all Raft retries and leader forwarding live in `raft/cluster.rs`; all
//! error → gRPC status mapping lives in `api/status.rs`; all wire conversion lives in
//! `api/to_proto.rs` and `api/from_proto.rs`.

pub mod api;
pub mod build_info;
pub(crate) mod clock;
pub mod config;
pub(crate) mod console;
pub mod daemon;
pub mod executor;
pub mod gpu;
pub mod host;
pub(crate) mod leader;
pub(crate) mod monitor;
pub(crate) mod notify;
pub mod raft;
pub mod run_cgroup_name;
pub mod scheduler;
pub(crate) mod server;
pub mod tls;
pub mod tools;
