//! A write on its way to the leader, and the committed answer that comes back.

use gpu_raft_store::{ApplyResult, Command, RequestMeta};

/// A write on its way to the leader: the command and, for API requests, who asked (`meta`, the
/// audit entry) with the credential they asked with, so that the leader authenticates and
/// authorizes the caller itself rather than taking a forwarding agent's word for it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Proposal {
    pub cmd: Command,
    #[serde(default)]
    pub meta: Option<RequestMeta>,
    /// The caller's bearer token (`id.secret`). Travels only agent to leader over mutual TLS;
    /// never in the log, never printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<Credential>,
}

/// Who a write is made for: its audit entry and, when the caller authenticated, its credential.
#[derive(Clone, Debug)]
pub struct OnBehalf {
    pub meta: RequestMeta,
    pub credential: Option<Credential>,
}

/// A caller's bearer token, `id.secret`, redacted when printed.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Credential(pub String);

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = self.0.split_once('.').map_or("?", |(id, _)| id);
        write!(f, "Credential({id}.…)")
    }
}

/// A committed write: its log index and how it applied. The reply of a forwarded write.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Written {
    pub index: u64,
    pub result: ApplyResult,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_is_never_printed() {
        let c = Credential("abc.s3cr3t".into());
        assert_eq!(format!("{c:?}"), "Credential(abc.…)");
        let p = Proposal {
            cmd: Command::CancelJob { job: 1 },
            meta: None,
            credential: Some(c),
        };
        assert!(!format!("{p:?}").contains("s3cr3t"));
    }
}
