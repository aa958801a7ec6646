//! Reaching the cluster: the endpoint list, tried in order, moving on when an agent is down.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::{Interceptor, interceptor::InterceptedService};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// Why a command failed: the server's answer, or no agent reachable at all.
#[derive(Debug)]
pub(crate) enum CallError {
    Unreachable(Vec<String>),
    Status(tonic::Status),
}

impl CallError {
    /// Worth asking again later: no agent answered, the cluster is between leaders, or the
    /// request ran out of time (tonic reports its own per-request deadline as `Cancelled`).
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            CallError::Unreachable(_) => true,
            CallError::Status(s) => matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Unreachable(tried) => {
                write!(f, "no agent answered; tried: {}", tried.join("; "))
            }
            CallError::Status(s) => write!(f, "{}: {}", code_name(s.code()), s.message()),
        }
    }
}

fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::InvalidArgument => "invalid argument",
        tonic::Code::NotFound => "not found",
        tonic::Code::Unavailable => "unavailable",
        tonic::Code::DeadlineExceeded => "timed out",
        tonic::Code::PermissionDenied => "permission denied",
        tonic::Code::Unauthenticated => "unauthenticated",
        tonic::Code::ResourceExhausted => "resource exhausted",
        tonic::Code::FailedPrecondition => "failed precondition",
        _ => "failed",
    }
}

/// A connection to one agent that sends the caller's bearer token and the request id of the
/// call it serves.
pub(crate) type Conn = InterceptedService<Channel, Credentials>;

#[derive(Clone, Debug)]
pub(crate) struct Credentials {
    authorization: Option<MetadataValue<Ascii>>,
    /// The request id every attempt of one call carries (`Endpoints::call`), so that the
    /// agents apply a write that reached them twice only once.
    request_id: Option<MetadataValue<Ascii>>,
}

impl Credentials {
    /// `bearer` is `<id>.<secret>`; a value that cannot be a header is refused.
    pub(crate) fn new(bearer: Option<&str>) -> Result<Self, String> {
        let authorization = bearer
            .map(|b| {
                format!("Bearer {}", b.trim())
                    .parse()
                    .map_err(|_| "the token has characters a header cannot carry".to_owned())
            })
            .transpose()?;
        Ok(Self {
            authorization,
            request_id: None,
        })
    }

    /// These credentials with a new request id, which every try of one call then carries.
    fn for_one_request(&self) -> Self {
        Self {
            authorization: self.authorization.clone(),
            request_id: format!("{:016x}", rand::random::<u64>()).parse().ok(),
        }
    }
}

impl Interceptor for Credentials {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(auth) = &self.authorization {
            req.metadata_mut().insert("authorization", auth.clone());
        }
        if let Some(id) = &self.request_id {
            req.metadata_mut().insert("x-request-id", id.clone());
        }
        Ok(req)
    }
}

pub(crate) struct Endpoints {
    addrs: Vec<String>,
    timeout: Duration,
    credentials: Credentials,
    /// `None`: plaintext.
    tls: Option<ClientTlsConfig>,
}

impl Endpoints {
    pub(crate) fn new(
        addrs: Vec<String>,
        timeout: Duration,
        credentials: Credentials,
        tls: Option<ClientTlsConfig>,
    ) -> Self {
        Self {
            addrs,
            timeout,
            credentials,
            tls,
        }
    }

    /// Run `call` against the first agent that accepts a connection and answers. An agent that
    /// is down (connection refused, unavailable) is skipped. An agent's answer that the cluster
    /// is busy (`RESOURCE_EXHAUSTED`: a rate limit) or between leaders (`UNAVAILABLE`) is asked
    /// again, backing off, until the deadline (saying so once on a terminal); any other answer
    /// is final. Every try carries the same request id, so a write is applied once however
    /// many tries reach the cluster.
    pub(crate) async fn call<T, F, Fut>(&self, mut call: F) -> Result<T, CallError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let credentials = self.credentials.for_one_request();
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Backoff::default();
        let mut noted = false;
        loop {
            let refusal = match self.try_each(&credentials, &mut call).await {
                Err(CallError::Status(s)) if answered_busy(&s) => s,
                other => return other,
            };
            let Some(pause) = backoff.next_before(deadline) else {
                return Err(CallError::Status(refusal));
            };
            if !noted && std::io::stderr().is_terminal() {
                eprintln!(
                    "note: {}; asking again until the deadline ({}s)",
                    refusal.message(),
                    self.timeout.as_secs()
                );
                noted = true;
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// One pass over the endpoints, in order.
    async fn try_each<T, F, Fut>(
        &self,
        credentials: &Credentials,
        call: &mut F,
    ) -> Result<T, CallError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let mut tried = Vec::new();
        for addr in &self.addrs {
            let channel = match self.connect(addr).await {
                Ok(c) => c,
                Err(e) => {
                    tried.push(format!("{addr}: {e}"));
                    continue;
                }
            };
            match call(InterceptedService::new(channel, credentials.clone())).await {
                Ok(v) => return Ok(v),
                Err(s) if s.code() == tonic::Code::Unavailable && is_transport(&s) => {
                    tried.push(format!("{addr}: {}{}", s.message(), self.plaintext_hint()));
                }
                Err(s) if is_transport(&s) && self.tls.is_none() => {
                    let message = format!("{}{}", s.message(), self.plaintext_hint());
                    return Err(CallError::Status(tonic::Status::new(s.code(), message)));
                }
                Err(s) => return Err(CallError::Status(s)),
            }
        }
        Err(CallError::Unreachable(tried))
    }

    /// What to add to a transport error when gpuctl spoke plaintext to agents that speak TLS.
    fn plaintext_hint(&self) -> &'static str {
        if self.tls.is_some() {
            ""
        } else {
            " (gpuctl has no CA configured, so it spoke plaintext, and agents speak TLS: set \
             ca_file, cert_file and key_file in ~/.config/gpumesh/gpuctl.toml, or \
             GPUCTL_CA_FILE, GPUCTL_CERT_FILE and GPUCTL_KEY_FILE)"
        }
    }

    async fn connect(&self, addr: &str) -> Result<Channel, String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| format!("bad address: {e}"))?
            .connect_timeout(self.timeout.min(Duration::from_secs(3)))
            .timeout(self.timeout);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| error_chain(&e))?;
        }
        endpoint.connect().await.map_err(|e| error_chain(&e))
    }
}

/// An agent's answer that the same request may succeed a little later: a rate limit, or no
/// leader right now. (A transport failure is not an answer: the next agent is tried.)
fn answered_busy(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::ResourceExhausted | tonic::Code::Unavailable
    ) && !is_transport(s)
}

/// Pauses between tries: from 100 ms, doubling to at most 2 s, each with up to half again of
/// jitter so that many clients refused together do not come back together.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: Duration::from_millis(100),
        }
    }
}

impl Backoff {
    /// The next pause, unless it would end past `deadline`.
    fn next_before(&mut self, deadline: Instant) -> Option<Duration> {
        let jitter = self.next.mul_f64(rand::random::<f64>() / 2.0);
        let pause = self.next + jitter;
        self.next = (self.next * 2).min(Duration::from_secs(2));
        (Instant::now() + pause < deadline).then_some(pause)
    }
}

/// A status produced by the transport (agent gone mid-call), not by the agent's logic.
pub(crate) fn is_transport(s: &tonic::Status) -> bool {
    std::error::Error::source(s).is_some() || s.message().contains("transport")
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
