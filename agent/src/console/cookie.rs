//! The session cookie: where the browser keeps its token. Scripts cannot read it (`HttpOnly`),
//! no other site's page sends it (`SameSite=Strict`), it goes only over TLS (`Secure`, when the
//! port speaks TLS) and only to the console's paths, for at most 12 hours.

use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};

const NAME: &str = "gpumesh_console";

/// How long a browser keeps the cookie; the token's own expiry and revocation apply sooner.
const MAX_AGE_S: u64 = 12 * 3600;

/// The token a request's cookie carries.
pub(super) fn credential(parts: &Parts) -> Option<String> {
    parts
        .headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == NAME)
        .map(|(_, value)| value.to_owned())
}

/// A `Set-Cookie` keeping `credential`.
pub(super) fn keeping(credential: &str, tls: bool) -> Option<HeaderValue> {
    let secure = if tls { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{NAME}={credential}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={MAX_AGE_S}{secure}"
    ))
    .ok()
}

/// A `Set-Cookie` that makes the browser forget the session.
pub(super) fn cleared() -> HeaderValue {
    HeaderValue::from_static(
        "gpumesh_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0",
    )
}

/// To the login page, saying why (an expired or revoked token, a session that never was),
/// the session forgotten.
pub(super) fn login_again(why: &str) -> Response {
    let query = serde_urlencoded::to_string([("why", why)]).unwrap_or_default();
    let mut response = Redirect::to(&format!("/console/login?{query}")).into_response();
    response.headers_mut().insert(header::SET_COOKIE, cleared());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_found_among_others() {
        let req = axum::http::Request::builder()
            .header("cookie", "x=1; gpumesh_console=t1.s3cret; y=2")
            .body(())
            .expect("request");
        let (parts, ()) = req.into_parts();
        assert_eq!(credential(&parts).as_deref(), Some("t1.s3cret"));
        let kept = keeping("t1.s3cret", true).expect("a header");
        let kept = kept.to_str().expect("text");
        for attribute in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/console"] {
            assert!(kept.contains(attribute), "{kept}");
        }
    }
}
