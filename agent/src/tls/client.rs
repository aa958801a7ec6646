//! How agents and tools connect to agents: TLS to the cluster CA, verifying the agent name
//! [`SERVER_NAME`](super::pki::SERVER_NAME), presenting our own certificate when we have one.

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use super::pki::{KeyedCert, SERVER_NAME};

pub fn config(ca_cert_pem: &str, me: Option<&KeyedCert>) -> ClientTlsConfig {
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_cert_pem))
        .domain_name(SERVER_NAME);
    match me {
        Some(me) => config.identity(Identity::from_pem(&me.cert_pem, &me.key_pem)),
        None => config,
    }
}
