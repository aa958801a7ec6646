//! What every console response carries and every console request must pass, whatever page it
//! is for: headers that keep other sites from framing, scripting or caching the pages, and a
//! refusal of state-changing requests that another site started.

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

/// Scripts, styles and connections from this origin only, no inline script or style (a name
/// that slipped past escaping still could not run), no framing, no forms to other sites.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
                   base-uri 'none'";

/// `pages` with the console's guard around each of its routes.
pub(super) fn layered(pages: Router) -> Router {
    pages.layer(middleware::from_fn(guard))
}

async fn guard(req: Request, next: Next) -> Response {
    // HTTP/2 carries the host in the URI (`:authority`), HTTP/1.1 in the Host header.
    let host = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| text(req.headers(), header::HOST).map(str::to_owned));
    if let Err(why) = same_site(req.method(), req.headers(), host.as_deref()) {
        return (StatusCode::FORBIDDEN, why).into_response();
    }
    let mut response = next.run(req).await;
    let headers = response.headers_mut();
    let mut set = |name, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(header::CONTENT_SECURITY_POLICY, CSP);
    set(header::X_FRAME_OPTIONS, "DENY");
    set(header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    // Not `no-referrer`: with it a browser sends `Origin: null` on the console's own forms.
    set(header::REFERRER_POLICY, "same-origin");
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// A request that changes something must come from the console's own pages: the browser says
/// where a request comes from (`Sec-Fetch-Site`, `Origin`), and a cross-site form or script
/// cannot hide it. (The session cookie is `SameSite=Strict` and every form carries a token
/// derived from the session as well; this is the first of three locks.)
fn same_site(method: &Method, headers: &HeaderMap, host: Option<&str>) -> Result<(), &'static str> {
    if matches!(*method, Method::GET | Method::HEAD) {
        return Ok(());
    }
    if let Some(site) = text(headers, header::HeaderName::from_static("sec-fetch-site"))
        && !matches!(site, "same-origin" | "none")
    {
        return Err("refused: a request from another site may not change anything here");
    }
    if let Some(origin) = text(headers, header::ORIGIN) {
        let host = host.unwrap_or_default();
        let origin_host = origin
            .strip_prefix("https://")
            .or_else(|| origin.strip_prefix("http://"))
            .unwrap_or("");
        if host.is_empty() || origin_host != host {
            return Err("refused: a request from another origin may not change anything here");
        }
    }
    Ok(())
}

fn text(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn reads_pass_and_writes_from_elsewhere_are_refused() {
        let host = Some("a:7070");
        let cross = headers(&[("sec-fetch-site", "cross-site")]);
        assert!(same_site(&Method::GET, &cross, host).is_ok());
        assert!(same_site(&Method::POST, &cross, host).is_err());
        let other_origin = headers(&[("origin", "https://evil.example")]);
        assert!(same_site(&Method::POST, &other_origin, host).is_err());
        let own = headers(&[
            ("origin", "https://a:7070"),
            ("sec-fetch-site", "same-origin"),
        ]);
        assert!(same_site(&Method::POST, &own, host).is_ok());
        // No host to compare the origin with: refused.
        assert!(same_site(&Method::POST, &own, None).is_err());
    }
}
