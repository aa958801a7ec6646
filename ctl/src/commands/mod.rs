//! One module per noun. Each verb resolves its arguments, calls the API, and renders the answer.

pub mod cluster;
pub mod node;

use crate::cli::Output;
use crate::client::{CallError, Endpoints};

/// What a command hands back to `main`: text for stdout and whether the answer was positive.
pub struct Answer {
    pub text: String,
    /// `false` maps to exit code 1 (a negative answer, not an error).
    pub positive: bool,
}

/// The resolved context every command runs in.
pub struct Ctx {
    pub endpoints: Endpoints,
    pub output: Output,
}

/// A command failure: bad arguments (caught before any call) or the call failed.
#[derive(Debug)]
pub enum Failure {
    Usage(String),
    Call(CallError),
}

impl From<CallError> for Failure {
    fn from(e: CallError) -> Self {
        Failure::Call(e)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Usage(m) => f.write_str(m),
            Failure::Call(e) => e.fmt(f),
        }
    }
}
