//! gpu-chaos: the fault-injection harness and history checkers (a first slice of the [chaos]
//! issue). A scenario starts a real cluster (`gpu-tests`), runs a recorded client workload
//! (`workload`, `client`) against it while a nemesis injects faults (`nemesis`, `storm`), heals,
//! and runs pure checkers (`check`) over the history and the final job list.

pub mod catalog;
pub mod check;
pub mod client;
pub mod crash;
pub mod failpoints;
pub mod history;
pub mod holder;
pub mod isolation;
pub mod lagging;
pub mod membership;
pub mod model;
pub mod nemesis;
pub mod netns;
pub mod observer;
pub mod partition;
pub mod pause;
pub mod ready;
pub mod scenario;
pub mod seed;
pub mod settle;
pub mod splits;
pub mod storm;
pub mod timeline;
pub mod transport;
pub mod workload;
