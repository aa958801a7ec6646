//! `gpu-agent` subcommands beside `run`: the local dev mesh, the footprint benchmark, restoring
//! a backup, and the offline scheduling simulator.

pub mod dev;
pub mod footprint;
pub mod restore;
pub mod simulate;
