//! What a page shows when the API refused or failed: the API's own message, with the HTTP
//! status that matches the gRPC one; a session that is no longer valid goes back to the login.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use tonic::{Code, Status};

use super::view;

#[derive(Debug)]
pub(super) struct Failure(pub Status);

impl From<Status> for Failure {
    fn from(s: Status) -> Self {
        Failure(s)
    }
}

/// A console page or fragment: its HTML, or why there is none.
pub(super) type Page = Result<Response, Failure>;

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status = self.0;
        if status.code() == Code::Unauthenticated {
            return login_again(status.message());
        }
        let http = match status.code() {
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                StatusCode::BAD_REQUEST
            }
            Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable | Code::DeadlineExceeded => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let body = view::bare(
            "gpumesh: refused",
            html! {
                main.narrow {
                    h1 { (http.canonical_reason().unwrap_or("error")) }
                    p.refusal { (status.message()) }
                    p { a href="/console/jobs" { "Jobs" } " · " a href="/console/cluster" { "Cluster" } }
                }
            },
        );
        (http, body).into_response()
    }
}

/// To the login page, saying why (an expired or revoked token, a session that never was).
pub(super) fn login_again(why: &str) -> Response {
    let query = serde_urlencoded::to_string([("why", why)]).unwrap_or_default();
    let url = format!("/console/login?{query}");
    let mut response = Redirect::to(&url).into_response();
    response.headers_mut().insert(
        axum::http::header::SET_COOKIE,
        super::session::cleared_cookie(),
    );
    response
}
