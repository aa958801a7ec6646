//! gpumesh wire protocol: generated code for the public `gpumesh.v1` API and the internal
//! `gpumesh.internal.v1` peer API. No other logic lives here, only the tiny helpers every
//! client shares: connections (`tls`) and the API's globs (`glob`).

mod glob;
pub mod tls;

pub use glob::glob_matches;

/// The public API that `gpuctl` and other clients use.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("gpumesh.v1");
}

/// The agent-to-agent API. Clients never call it.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod internal {
    pub mod v1 {
        tonic::include_proto!("gpumesh.internal.v1");
    }
}

/// Largest gRPC message either side accepts (snapshots travel in chunks below this).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// The DNS name in every agent's certificate: what agents and gpuctl verify an agent against
/// (addresses change; the name does not).
pub const TLS_SERVER_NAME: &str = "gpumesh";
