//! Which build this is: the workspace version and the commit it was built from (`build.rs`).

/// The commit, abbreviated ("unknown" when built without git and without
/// `GPUMESH_BUILD_COMMIT`).
pub const COMMIT: &str = env!("GPUMESH_COMMIT");

/// The version with the commit as semver build metadata (`0.1.0+3439984`): what an agent
/// tells its peers (`protocol::BUILD_HEADER`) and `gpuctl cluster members` shows.
pub const BUILD: &str = concat!(env!("CARGO_PKG_VERSION"), "+", env!("GPUMESH_COMMIT"));

/// What `gpu-agent --version` prints after the name: `0.1.0 (commit 3439984)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GPUMESH_COMMIT"),
    ")"
);
