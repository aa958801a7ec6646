//! How agents and tools connect to agents: TLS to the cluster CA, verifying the agent name
//! [`SERVER_NAME`](super::pki::SERVER_NAME), presenting our own certificate when we have one.
//! The configuration itself is `gpu_proto::tls`, shared with gpuctl.

use tonic::transport::ClientTlsConfig;

use super::pki::KeyedCert;

pub fn config(ca_cert_pem: &str, me: Option<&KeyedCert>) -> ClientTlsConfig {
    gpu_proto::tls::client_config(
        ca_cert_pem,
        me.map(|me| (me.cert_pem.as_str(), me.key_pem.as_str())),
    )
}
