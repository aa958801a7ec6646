//! Logging in and out: the login page (which also takes a token from a link's fragment, see
//! `assets/console.js`), the check of a token through the API before the cookie is set, and
//! the logout, which makes the browser forget it.

use axum::Form;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;

use super::cookie::{self, login_again};
use super::session::{Remote, Session, open};
use super::{Shared, frame};

#[derive(Deserialize)]
pub(super) struct LoginQuery {
    #[serde(default)]
    why: String,
}

pub(super) async fn page(Query(q): Query<LoginQuery>) -> Response {
    frame::document(
        "gpumesh: log in",
        html! {
            main.narrow {
                h1 { "gpumesh" }
                @if !q.why.is_empty() { p.refusal { (q.why) } }
                form #login method="post" action="/console/login" {
                    label for="token" { "Token" }
                    input #token type="password" name="token" autocomplete="off"
                        placeholder="<id>.<secret>" required;
                    button type="submit" { "Log in" }
                }
                p.hint { "A token from " code { "gpuctl token create" } " or " code { "gpu-agent dev" } "." }
            }
        },
    )
    .into_response()
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    token: String,
}

pub(super) async fn login(
    State(apis): State<Shared>,
    Remote(remote): Remote,
    Form(form): Form<LoginForm>,
) -> Response {
    let credential = form.token.trim().to_owned();
    match open(&apis, credential.clone(), remote).await {
        Ok(_) => {
            let mut response = Redirect::to("/console/jobs").into_response();
            if let Some(v) = cookie::keeping(&credential, apis.tls) {
                response.headers_mut().insert(header::SET_COOKIE, v);
            }
            response
        }
        Err(status) => login_again(status.message()),
    }
}

#[derive(Deserialize)]
pub(super) struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

pub(super) async fn logout(session: Session, Form(form): Form<CsrfForm>) -> Response {
    if let Err(refused) = session.check_csrf(&form.csrf) {
        return refused.into_response();
    }
    let mut response = Redirect::to("/console/login").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cookie::cleared());
    response
}
