//! Authentication and authorization at the API edge. Every public RPC starts with
//! `Auth::check`: the caller's TLS certificate must be one of the cluster's (not revoked), the
//! bearer token is looked up in the local replica (so a revocation takes effect on an agent as
//! soon as it applies it), the role is checked against the action, and a refusal is written to
//! the audit log before the caller is told.

pub(crate) mod forwarded;
pub(crate) mod limit;
pub(crate) mod peer;
pub(crate) mod rbac;
pub mod token;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpu_raft_store::write_trace::{self, Stage};
use gpu_raft_store::{Command, RequestMeta};
use tonic::{Request, Status};
use tracing::warn;

use self::limit::{Limits, Verdict};
use self::peer::PeerCheck;
use self::rbac::{Action, Identity};
use crate::clock::now_ms;
use crate::raft::{Cluster, Credential, OnBehalf};

#[derive(Clone)]
pub struct Auth {
    pub cluster: Cluster,
    pub peers: PeerCheck,
    /// Requests per token, tenant and source address, and logged refusals per source.
    pub limits: Arc<Mutex<Limits>>,
}

/// An authenticated, authorized request: who, the audit metadata for what it writes, and the
/// credential it came with (which goes with its writes to the leader).
pub struct Caller {
    pub identity: Identity,
    pub meta: RequestMeta,
    credential: Credential,
}

impl Caller {
    /// What its writes carry: its audit entry and its credential.
    pub fn on_behalf(&self) -> Option<OnBehalf> {
        self.on_behalf_as(self.meta.clone())
    }

    /// `on_behalf` with another audit entry for the same caller.
    pub fn on_behalf_as(&self, meta: RequestMeta) -> Option<OnBehalf> {
        Some(OnBehalf {
            meta,
            credential: Some(self.credential.clone()),
        })
    }
}

impl Auth {
    /// Authenticate `req` and check it may perform `action`. `verb` and `object` name the
    /// request in the audit log (`job.submit`, `job/j-4`).
    pub async fn check<T>(
        &self,
        req: &Request<T>,
        verb: &str,
        object: &str,
        action: Action<'_>,
    ) -> Result<Caller, Status> {
        self.authorize(req, verb, object, action, true).await
    }

    /// A further check for an authenticated caller (e.g. once the job's tenant is known).
    pub async fn require(&self, caller: &Caller, action: Action<'_>) -> Result<(), Status> {
        if let Err(reason) = caller.identity.may(action) {
            self.record_denial(caller, &reason).await;
            return Err(Status::permission_denied(reason));
        }
        Ok(())
    }

    /// `check` for the one call made without a client certificate: a new agent enrolling
    /// with a join token.
    pub async fn check_enrolment<T>(
        &self,
        req: &Request<T>,
        verb: &str,
        object: &str,
        action: Action<'_>,
    ) -> Result<Caller, Status> {
        self.authorize(req, verb, object, action, false).await
    }

    async fn authorize<T>(
        &self,
        req: &Request<T>,
        verb: &str,
        object: &str,
        action: Action<'_>,
        need_certificate: bool,
    ) -> Result<Caller, Status> {
        let caller = self.token(req, verb, object, need_certificate).await?;
        self.require(&caller, action).await?;
        Ok(caller)
    }

    /// Authenticate only (the handler checks finer rules itself, e.g. per job).
    pub async fn authenticate<T>(
        &self,
        req: &Request<T>,
        verb: &str,
        object: &str,
    ) -> Result<Caller, Status> {
        write_trace::stamp(Stage::Request, 0);
        self.token(req, verb, object, true).await
    }

    async fn token<T>(
        &self,
        req: &Request<T>,
        verb: &str,
        object: &str,
        need_certificate: bool,
    ) -> Result<Caller, Status> {
        let request_id = req
            .metadata()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= 64 && v.chars().all(|c| c.is_ascii_graphic()))
            .map_or_else(|| hex::encode(rand::random::<[u8; 8]>()), str::to_owned);
        let source = req
            .remote_addr()
            .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
        let mut meta = RequestMeta {
            actor: "anonymous".into(),
            verb: verb.to_owned(),
            object: object.to_owned(),
            request_id,
            source,
        };
        if need_certificate && let Err(refusal) = self.peers.any(req) {
            return Err(self.refuse(meta, refusal));
        }
        let header = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let Some((id, secret)) = header.and_then(token::parse_header) else {
            let reason = if header.is_some() {
                "malformed bearer token"
            } else {
                "no bearer token"
            };
            let refusal = Status::unauthenticated(format!(
                "{reason}: send `authorization: Bearer <id>.<secret>`"
            ));
            return Err(self.refuse(meta, refusal));
        };
        let lookup = || self.cluster.state.read(|s| s.tokens.get(id).cloned());
        let mut record = lookup();
        if token::identify(record.as_ref(), secret, now_ms()).is_err() {
            // This replica may simply be behind (a token minted through another agent a moment
            // ago, or a restart still replaying): catch up once before refusing.
            if self.cluster.linearizable_read().await.is_ok() {
                record = lookup();
            }
        }
        let identity = match token::identify(record.as_ref(), secret, now_ms()) {
            Ok(identity) => identity,
            Err(why) => {
                if record.is_some_and(|t| t.revoked) {
                    meta.actor = id.to_owned();
                }
                return Err(self.refuse(meta, Status::unauthenticated(why)));
            }
        };
        let credential = Credential(format!("{id}.{secret}"));
        meta.actor.clone_from(&identity.token_id);
        let over = self.limits().caller(
            &identity.token_id,
            identity.tenant.as_deref(),
            host_of(&meta.source),
            Instant::now(),
        );
        if let Err(over) = over {
            let refusal = Status::resource_exhausted(format!(
                "rate limit: {} is sending too many requests; slow down",
                over.limit
            ));
            let caller = Caller {
                identity,
                meta,
                credential,
            };
            if over.first {
                self.record_denial(&caller, refusal.message()).await;
            }
            return Err(refusal);
        }
        Ok(Caller {
            identity,
            meta,
            credential,
        })
    }

    fn limits(&self) -> std::sync::MutexGuard<'_, Limits> {
        self.limits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuse an unauthenticated request. It is logged here, not replicated (else anyone who
    /// can reach the port could fill the cluster's log), and in a flood from one source address
    /// only the first refusal beyond the rate limit is.
    fn refuse(&self, meta: RequestMeta, refusal: Status) -> Status {
        let verdict = self.limits().refusal(host_of(&meta.source), Instant::now());
        let quiet = match verdict {
            Verdict::Allowed => "",
            Verdict::Limited { first: true } => {
                "; further refusals from this address are not logged until its rate drops"
            }
            Verdict::Limited { first: false } => return refusal,
        };
        warn!(
            source = %meta.source,
            verb = %meta.verb,
            object = %meta.object,
            actor = %meta.actor,
            reason = refusal.message(),
            "refused an unauthenticated request{quiet}"
        );
        refusal
    }

    /// Write `reason` for a refused request of an authenticated caller to the audit log (with
    /// the caller's credential, which the leader checks); a failure to do so is logged, the
    /// request is refused either way.
    pub async fn record_denial(&self, caller: &Caller, reason: &str) {
        let cmd = Command::AuditDenied {
            reason: reason.to_owned(),
        };
        if let Err(e) = self.cluster.write_as(cmd, caller.on_behalf()).await {
            warn!(error = %e, "could not audit a refused request");
        }
    }
}

/// The host part of a source address (`ip:port`, `[v6]:port`).
fn host_of(source: &str) -> &str {
    source.rsplit_once(':').map_or(source, |(h, _)| h)
}
