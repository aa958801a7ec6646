//! The commit gpuctl is built from (`--version`), found as the agent's build script finds it.

#[path = "../agent/build.rs"]
mod agent_build;

fn main() {
    agent_build::main();
}
