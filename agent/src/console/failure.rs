//! What a page shows when the API refused or failed: the API's own message, with the HTTP
//! status that matches the gRPC one; a session that is no longer valid goes back to the login.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;
use tonic::{Code, Status};

use super::cookie::login_again;
use super::frame;

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
        let body = frame::document(
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
