//! Who is on the other end of a request, from its TLS client certificate, checked per RPC:
//! internal RPCs need an agent's certificate, public ones any certificate of the cluster, and
//! only the enrolment call (a new agent asking for its first certificate) goes without one.
//! A revoked serial is refused as soon as this replica has applied the revocation.

use gpu_raft_store::{NodeId, StateReader};
use tonic::{Request, Status};

use crate::tls::pki::{self, Subject};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// This agent runs without TLS (`--insecure`, loopback only): nobody is identified.
    Insecure,
    /// A TLS client that presented no certificate.
    Anonymous,
    Node(NodeId),
    Client(String),
    /// The agent's own web console, asking for a browser that logged in with a token.
    Console,
}

/// Marks a request that the agent's web console made in-process for a browser (which holds a
/// token but no client certificate). Extensions never come off the wire, so no network
/// client can set it; the token is checked as for any other request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConsoleOrigin;

#[derive(Clone)]
pub struct PeerCheck {
    pub tls: bool,
    pub state: StateReader,
}

impl PeerCheck {
    pub fn peer<T>(&self, req: &Request<T>) -> Result<Peer, Status> {
        if !self.tls {
            return Ok(Peer::Insecure);
        }
        if req.extensions().get::<ConsoleOrigin>().is_some() {
            return Ok(Peer::Console);
        }
        let Some(leaf) = req.peer_certs().and_then(|c| c.first().cloned()) else {
            return Ok(Peer::Anonymous);
        };
        let info = pki::inspect(&leaf)
            .map_err(|e| Status::unauthenticated(format!("client certificate: {e}")))?;
        if self.state.read(|s| s.is_revoked(&info.serial)) {
            return Err(Status::unauthenticated(format!(
                "certificate {} ({}) is revoked",
                info.serial, info.subject
            )));
        }
        Ok(match info.subject {
            Subject::Node(id) => Peer::Node(id),
            Subject::Client(name) => Peer::Client(name),
        })
    }

    /// Internal RPCs: the calling agent's id (`None` without TLS), or a refusal.
    pub fn node<T>(&self, req: &Request<T>) -> Result<Option<NodeId>, Status> {
        match self.peer(req)? {
            Peer::Insecure => Ok(None),
            Peer::Node(id) => Ok(Some(id)),
            Peer::Anonymous => Err(Status::unauthenticated(
                "internal RPCs need an agent certificate; none was presented",
            )),
            Peer::Client(name) => Err(Status::permission_denied(format!(
                "client certificate {name} may not call internal RPCs"
            ))),
            Peer::Console => Err(Status::permission_denied(
                "the web console may not call internal RPCs",
            )),
        }
    }

    /// Internal RPCs that speak for a node (Raft messages): the certificate must name `claimed`.
    pub fn node_is<T>(&self, req: &Request<T>, claimed: NodeId) -> Result<(), Status> {
        Self::is(self.node(req)?, claimed)
    }

    /// `node_is` for the node a request's certificate named (`node`), read before the
    /// request was taken apart.
    pub fn is(node: Option<NodeId>, claimed: NodeId) -> Result<(), Status> {
        match node {
            Some(id) if id != claimed => Err(Status::permission_denied(format!(
                "the certificate of node {id} may not speak as node {claimed}"
            ))),
            _ => Ok(()),
        }
    }

    /// Public RPCs: any certificate of the cluster.
    pub fn any<T>(&self, req: &Request<T>) -> Result<Peer, Status> {
        match self.peer(req)? {
            Peer::Anonymous => Err(Status::unauthenticated(
                "a client certificate is required (gpuctl: set ca_file, cert_file and key_file)",
            )),
            peer => Ok(peer),
        }
    }
}
