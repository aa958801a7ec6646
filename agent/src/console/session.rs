//! Who is using the console: a token, kept in the session cookie (`cookie.rs`) and checked again on every request by the API itself (`TokenService.WhoAmI`), so an expired or
//! revoked token ends the session at its next click. Every request the console makes for the
//! browser carries that token, and the API's own authorization decides what it may see.

use std::net::SocketAddr;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Redirect, Response};
use gpu_proto::v1 as pb;
use gpu_proto::v1::token_service_server::TokenService;
use sha2::{Digest, Sha256};
use tonic::metadata::MetadataValue;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::Shared;
use super::cookie::{self, login_again};
use super::failure::Failure;
use crate::api::auth::peer::ConsoleOrigin;
use crate::api::auth::rbac::{Action, Identity};
use crate::api::auth::token::parse_header;
use crate::api::from_proto;

/// A logged-in browser.
pub(super) struct Session {
    credential: String,
    remote: Option<SocketAddr>,
    pub(super) who: pb::Token,
    identity: Identity,
    /// Every form of this session carries it; a form posted without it is refused.
    pub(super) csrf: String,
}

impl Session {
    /// `msg` as a request of this session's token to the API's handlers.
    pub(super) fn request<T>(&self, msg: T) -> tonic::Request<T> {
        request_as(&self.credential, self.remote, msg)
    }

    /// Whether the permission table lets this session's token do `action` (to show a button
    /// or a link only where it would work; the API decides either way).
    pub(super) fn may(&self, action: Action<'_>) -> bool {
        self.identity.may(action).is_ok()
    }

    /// Whether this session may submit jobs (to its own tenant; an admin anywhere).
    pub(super) fn may_submit(&self) -> bool {
        let tenant = self.identity.tenant.as_deref().unwrap_or_default();
        self.may(Action::WriteJob(tenant))
    }

    /// Refuse a form that does not carry this session's CSRF token.
    pub(super) fn check_csrf(&self, given: &str) -> Result<(), Failure> {
        let same = given.len() == self.csrf.len()
            && given
                .bytes()
                .zip(self.csrf.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(())
        } else {
            Err(Failure(tonic::Status::permission_denied(
                "this form did not come from this console session (missing or wrong CSRF token); \
                 reload the page and try again",
            )))
        }
    }
}

fn request_as<T>(credential: &str, remote: Option<SocketAddr>, msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Ok(v) = MetadataValue::try_from(format!("Bearer {credential}")) {
        req.metadata_mut().insert("authorization", v);
    }
    req.extensions_mut().insert(ConsoleOrigin);
    req.extensions_mut().insert(TcpConnectInfo {
        local_addr: None,
        remote_addr: remote,
    });
    req
}

/// The browser's address, as the gRPC server noted it for this connection (for the audit log).
pub(super) struct Remote(pub(super) Option<SocketAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Remote {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Remote(remote_of(parts)))
    }
}

fn remote_of(parts: &Parts) -> Option<SocketAddr> {
    let ext = &parts.extensions;
    ext.get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            ext.get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|i| i.get_ref().remote_addr())
        })
}

/// The form token of a session: derived from its credential (so every agent derives the same),
/// unguessable without it, and readable by another site only if it could read the page.
fn csrf_of(credential: &str) -> String {
    let digest = Sha256::digest(format!("gpumesh console csrf\0{credential}"));
    hex::encode(&digest[..16])
}

pub(super) async fn open(
    apis: &Shared,
    credential: String,
    remote: Option<SocketAddr>,
) -> Result<Session, tonic::Status> {
    if parse_header(&format!("Bearer {credential}")).is_none() {
        return Err(tonic::Status::unauthenticated(
            "that is not a token (expected <id>.<secret>)",
        ));
    }
    let who = apis
        .token
        .who_am_i(request_as(&credential, remote, pb::WhoAmIRequest {}))
        .await?
        .into_inner();
    let role = from_proto::role(who.role)
        .ok_or_else(|| tonic::Status::unauthenticated("this token has no known role"))?;
    let identity = Identity {
        token_id: who.id.clone(),
        role,
        tenant: (!who.tenant.is_empty()).then(|| who.tenant.clone()),
    };
    Ok(Session {
        csrf: csrf_of(&credential),
        credential,
        remote,
        who,
        identity,
    })
}

impl FromRequestParts<Shared> for Session {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, apis: &Shared) -> Result<Self, Response> {
        let Some(credential) = cookie::credential(parts) else {
            return Err(Redirect::to("/console/login").into_response());
        };
        match open(apis, credential, remote_of(parts)).await {
            Ok(session) => Ok(session),
            Err(status) if status.code() == tonic::Code::Unauthenticated => {
                Err(login_again(status.message()))
            }
            Err(status) => Err(Failure(status).into_response()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_token_is_the_sessions_own() {
        assert_eq!(csrf_of("a.b"), csrf_of("a.b"));
        assert_ne!(csrf_of("a.b"), csrf_of("a.c"));
        assert_eq!(csrf_of("a.b").len(), 32);
    }
}
