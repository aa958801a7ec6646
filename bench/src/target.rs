//! A replicated store under test: something clients connect to and write through. gpumesh
//! (`mesh.rs`) and etcd (`etcd.rs`) both implement it, so every figure is taken the same way.

use std::future::Future;

/// A running cluster of `members()` members that clients write to.
pub trait Target: Sync {
    /// One client's connection.
    type Client: Send;

    fn members(&self) -> usize;

    /// The process ids of the running members (whose CPU time a run reports).
    fn pids(&self) -> Vec<u32>;

    /// Connect client `client` to member `client % members()`.
    fn connect(&self, client: usize) -> impl Future<Output = anyhow::Result<Self::Client>> + Send;

    /// One acknowledged, replicated write; `seq` is unique across every client of a run.
    fn write(
        &self,
        client: &mut Self::Client,
        seq: u64,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// One request answered by the member asked, writing nothing and skipping Raft: the
    /// client's transport and the member's request handling alone.
    fn round_trip(
        &self,
        client: &mut Self::Client,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// A target whose members can be killed and brought back (failover trials).
pub trait Crashable: Target {
    /// The member index (from 0) of the current leader, waiting for one.
    fn leader(&self) -> impl Future<Output = anyhow::Result<usize>> + Send;

    /// `kill -9` member `member`.
    fn kill(&mut self, member: usize);

    /// Start member `member` again on its data and wait until every member is healthy.
    /// (Not `Send`: the mesh holds the test harness's one-cluster-at-a-time guard.)
    fn restart(&mut self, member: usize) -> impl Future<Output = anyhow::Result<()>>;
}
