//! gpu-agent: the daemon every GPU host runs. It serves the public `gpumesh.v1` API and the
//! internal peer API, takes part in the Raft group, and (as leader) keeps the membership healthy.
//!
//! Architecture invariant: all Raft retries and leader forwarding live in `cluster.rs`; all
//! error → gRPC status mapping lives in `status.rs`; all wire conversion lives in `to_proto.rs`.

pub mod alert_service;
pub mod audit_service;
pub mod auth;
pub mod autopilot;
pub mod cert_service;
pub mod cluster;
pub mod cluster_service;
pub mod config;
pub mod contact;
pub mod dev;
pub mod executor;
pub mod failover;
pub mod footprint;
pub mod gpu;
pub mod gpu_service;
pub mod inventory;
pub mod job_service;
pub mod liveness;
pub mod monitor;
pub mod node;
pub mod node_service;
pub mod peer_client;
pub mod peer_service;
pub mod proc_stat;
pub mod proposer;
pub mod protocol;
pub mod raft_network;
pub mod restore;
pub mod scheduler;
pub mod scheduler_service;
pub mod sd_notify;
pub mod simulate;
pub mod status;
pub mod tenant_service;
pub mod tls;
pub mod to_proto;
pub mod token_service;
pub mod transport_faults;
pub mod watchdog;
