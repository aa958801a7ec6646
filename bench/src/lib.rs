//! gpu-bench: gpumesh's benchmarks, each run beside the same measurement of etcd on the same
//! machine in the same run, reported as ratios (`docs/benchmarks.md`).

pub mod array;
pub mod codec;
pub mod etcd;
pub mod etcd_tls;
pub mod failover;
pub mod fsync;
pub mod layers;
pub mod load;
pub mod mesh;
pub mod placement;
pub mod report;
pub mod stages;
pub mod state_growth;
pub mod stats;
pub mod svg;
pub mod target;
pub mod thread_cpu;

/// The client for the few etcd v3 RPCs used (`proto/etcd_subset.proto`).
#[allow(clippy::all, clippy::pedantic)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}
