//! One module per noun. Each verb resolves its arguments, calls the API, and renders the answer.

mod account;
pub(crate) mod alert;
pub(crate) mod audit;
mod batch_script;
pub(crate) mod cert;
mod cert_ca;
pub(crate) mod cluster;
pub(crate) mod debug;
pub(crate) mod gpu;
mod gpu_partition;
mod gpu_view;
pub(crate) mod image;
pub(crate) mod job;
mod job_bulk;
mod job_list;
mod job_logs;
mod job_pages;
mod job_submit;
mod job_view;
mod job_wait;
mod job_why;
pub(crate) mod node;
pub(crate) mod run;
pub(crate) mod scheduler;
pub(crate) mod tenant;
pub(crate) mod token;
pub(crate) mod top;

use std::time::Duration;

use serde_json::Value;

use crate::cli::Output;
use crate::client::{CallError, Conn, Endpoints};
use crate::output;

/// What a command hands back to `main`: text for stdout and whether the answer was positive.
pub(crate) struct Answer {
    pub text: String,
    /// `false` maps to exit code 1 (a negative answer, not an error).
    pub positive: bool,
}

impl Answer {
    /// A positive answer (exit 0).
    pub(crate) fn ok(text: String) -> Self {
        Self {
            text,
            positive: true,
        }
    }
}

/// The resolved context every command runs in.
pub(crate) struct Ctx {
    pub endpoints: Endpoints,
    pub output: Output,
    /// `--timeout` exactly as given; `job wait` bounds the whole wait with it.
    pub timeout: Option<Duration>,
}

impl Ctx {
    /// One unary RPC through the first agent that answers, the reply unwrapped: `new` is the
    /// generated client's constructor and `rpc` sends `req` with it, e.g.
    /// `ctx.call(JobServiceClient::new, req, async |mut c, r| c.get_job(r).await)`.
    pub(crate) async fn call<C, Req: Clone, Reply>(
        &self,
        new: fn(Conn) -> C,
        req: Req,
        rpc: impl AsyncFn(C, Req) -> Result<tonic::Response<Reply>, tonic::Status>,
    ) -> Result<Reply, CallError> {
        let (rpc, req) = (&rpc, &req);
        self.endpoints
            .call(move |ch| async move { Ok(rpc(new(ch), req.clone()).await?.into_inner()) })
            .await
    }

    /// A list in the chosen output format: a JSON array of `json(item)`, or `text(items)`.
    pub(crate) fn answer_list<T>(
        &self,
        items: &[T],
        json: impl Fn(&T) -> Value,
        text: impl FnOnce(&[T]) -> String,
    ) -> Answer {
        self.answer(
            || Value::Array(items.iter().map(json).collect()),
            || text(items),
        )
    }

    /// The answer in the chosen output format: `json()` as stable JSON, or `text()` for people.
    pub(crate) fn answer(
        &self,
        json: impl FnOnce() -> Value,
        text: impl FnOnce() -> String,
    ) -> Answer {
        Answer::ok(match self.output {
            Output::Json => output::json(&json()),
            Output::Table => text(),
        })
    }
}

/// A command failure: bad arguments (caught before any call), the call failed, or a wait
/// ran out of time.
#[derive(Debug)]
pub(crate) enum Failure {
    Usage(String),
    Call(CallError),
    TimedOut(String),
    /// `run`: the job ended other than successfully; gpuctl exits with this code (the outcome
    /// is already on stderr).
    JobEnded(u8),
}

impl From<CallError> for Failure {
    fn from(e: CallError) -> Self {
        Failure::Call(e)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Usage(m) | Failure::TimedOut(m) => f.write_str(m),
            Failure::Call(e) => e.fmt(f),
            Failure::JobEnded(code) => write!(f, "the job ended; exit code {code}"),
        }
    }
}
