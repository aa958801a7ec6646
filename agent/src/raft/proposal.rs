//! A write on its way to the leader, and the committed answer that comes back.

use gpu_raft_store::{ApplyResult, Command, RequestMeta};

/// A write on its way to the leader: the command and, for API requests, who asked.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Proposal {
    pub cmd: Command,
    #[serde(default)]
    pub meta: Option<RequestMeta>,
}

/// A committed write: its log index and how it applied. The reply of a forwarded write.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Written {
    pub index: u64,
    pub result: ApplyResult,
}
