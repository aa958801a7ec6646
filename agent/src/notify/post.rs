//! One webhook POST: HTTP/1.1 over TCP, or over TLS (rustls) for `https://`, trusting the
//! system's CA bundle and the agent's `api.webhook_ca_file`; one connection per post, each step
//! bounded in time.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::tls::pki;
use crate::tls::server::{cert_der, provider};

/// Where Debian (and most distributions) keep the system's trusted CAs.
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The most one post may take, connection and answer included.
const POST_DEADLINE: Duration = Duration::from_secs(10);

/// Posts webhooks.
#[derive(Clone)]
pub(crate) struct Poster {
    tls: TlsConnector,
}

impl Poster {
    /// A poster trusting the system's CAs (when the bundle exists) and those in `extra_ca`.
    pub(crate) fn new(extra_ca: Option<&Path>) -> anyhow::Result<Self> {
        let mut roots = RootCertStore::empty();
        // A certificate of the system's bundle that rustls cannot use is left out; the others
        // still count, and the agent starts.
        let system = std::fs::read_to_string(SYSTEM_BUNDLE).unwrap_or_default();
        for pem in pki::certs_in(&system) {
            if let Ok(der) = cert_der(&pem) {
                let _ = roots.add(der);
            }
        }
        // The operator's own file must be right.
        if let Some(path) = extra_ca {
            let extra = std::fs::read_to_string(path)
                .with_context(|| format!("reading api.webhook_ca_file {}", path.display()))?;
            let certs = pki::certs_in(&extra);
            anyhow::ensure!(
                !certs.is_empty(),
                "api.webhook_ca_file {} holds no PEM certificate",
                path.display()
            );
            for pem in certs {
                roots
                    .add(cert_der(&pem)?)
                    .with_context(|| format!("a certificate of {}", path.display()))?;
            }
        }
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            tls: TlsConnector::from(Arc::new(config)),
        })
    }

    /// POST `body` (JSON) with `headers` to `url`: the answer's status code, or why there was
    /// none.
    pub(crate) async fn post(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> Result<u16, String> {
        tokio::time::timeout(POST_DEADLINE, self.post_unbounded(url, headers, body))
            .await
            .map_err(|_| format!("no answer within {POST_DEADLINE:?}"))?
    }

    async fn post_unbounded(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> Result<u16, String> {
        let uri: Uri = url.parse().map_err(|e| format!("URL {url:?}: {e}"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(format!("URL {url:?} is not http(s)")),
        };
        let host = uri
            .host()
            .ok_or_else(|| format!("URL {url:?} names no host"))?;
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let bare_host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let tcp = TcpStream::connect((bare_host.as_str(), port))
            .await
            .map_err(|e| format!("connecting to {host}:{port}: {e}"))?;
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
        let mut request = Request::post(path)
            .header(hyper::header::HOST, authority(host, uri.port_u16()))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(
                hyper::header::USER_AGENT,
                concat!("gpumesh-agent/", env!("CARGO_PKG_VERSION")),
            );
        for (name, value) in headers {
            request = request.header(*name, value.as_str());
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("building the request: {e}"))?;
        if https {
            let name = ServerName::try_from(bare_host.clone())
                .map_err(|e| format!("{host} is not a TLS server name: {e}"))?;
            let tls = self
                .tls
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS with {host}:{port}: {e}"))?;
            send(TokioIo::new(tls), request).await
        } else {
            send(TokioIo::new(tcp), request).await
        }
    }
}

/// `host[:port]` for the Host header.
fn authority(host: &str, port: Option<u16>) -> String {
    match port {
        Some(p) => format!("{host}:{p}"),
        None => host.to_owned(),
    }
}

async fn send<T>(io: T, request: Request<Full<Bytes>>) -> Result<u16, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    let driver = tokio::spawn(conn);
    let answer = sender.send_request(request).await;
    driver.abort();
    answer
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("HTTP: {e}"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::ServerConfig;
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio_rustls::TlsAcceptor;

    use super::*;

    /// An https receiver on localhost with a certificate of its own: it answers one request
    /// 204 and hands back what it read. Returns its port, its certificate (PEM) and the read.
    async fn receiver() -> (u16, String, tokio::task::JoinHandle<String>) {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
        let cert_pem = made.cert.pem();
        let key = PrivateKeyDer::from_pem_slice(made.signing_key.serialize_pem().as_bytes())
            .expect("key");
        let config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert_der(&cert_pem).expect("der")], key)
            .expect("server config");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let served = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            let Ok(mut tls) = acceptor.accept(tcp).await else {
                return String::new();
            };
            let mut read = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&read).contains("\"done\":true") {
                let n = tls.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                read.extend_from_slice(&buf[..n]);
            }
            let answer = b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n";
            tls.write_all(answer).await.expect("answer");
            tls.flush().await.expect("flush");
            String::from_utf8_lossy(&read).into_owned()
        });
        (port, cert_pem, served)
    }

    #[tokio::test]
    async fn https_posts_trust_the_configured_ca_and_nothing_unknown() {
        let (port, cert_pem, served) = receiver().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_file = dir.path().join("webhook-ca.crt");
        std::fs::write(&ca_file, &cert_pem).expect("write the CA");
        let poster = Poster::new(Some(&ca_file)).expect("poster");
        let url = format!("https://localhost:{port}/hook?x=1");
        let headers = [("x-gpumesh-event", "end".to_owned())];
        let status = poster
            .post(&url, &headers, br#"{"done":true}"#.to_vec())
            .await
            .expect("posted");
        assert_eq!(status, 204);
        let request = served.await.expect("served").to_lowercase();
        assert!(request.starts_with("post /hook?x=1 http/1.1"), "{request}");
        assert!(request.contains("x-gpumesh-event: end"), "{request}");
        assert!(
            request.contains("content-type: application/json"),
            "{request}"
        );

        // Without the receiver's CA, the TLS handshake fails: nothing is sent.
        let (port, _, served) = receiver().await;
        let stranger = Poster::new(None).expect("poster");
        let url = format!("https://localhost:{port}/hook");
        let refused = stranger.post(&url, &[], b"{}".to_vec()).await;
        assert!(refused.expect_err("an unknown issuer").contains("TLS"));
        assert_eq!(served.await.expect("served"), "");
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("empty.crt");
        std::fs::write(&empty, "not a certificate").expect("write");
        let e = Poster::new(Some(&empty))
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("no PEM certificate"), "{e}");
    }
}
