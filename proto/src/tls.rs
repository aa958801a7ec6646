//! The TLS helpers every client of the cluster shares (gpuctl, agents dialling each other, the
//! test harnesses): the client configuration, and reading PEM files, refusing a private key
//! that other users could read.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::TLS_SERVER_NAME;

/// TLS to the cluster: trust `ca_pem`, verify the agent as [`TLS_SERVER_NAME`], and present
/// `identity` (certificate PEM, key PEM) when there is one.
pub fn client_config(ca_pem: &str, identity: Option<(&str, &str)>) -> ClientTlsConfig {
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name(TLS_SERVER_NAME);
    match identity {
        Some((cert_pem, key_pem)) => config.identity(Identity::from_pem(cert_pem, key_pem)),
        None => config,
    }
}

/// A file anyone may read (a certificate); the error names the file.
pub fn read_public(path: &Path) -> io::Result<String> {
    std::fs::read_to_string(path).map_err(|e| reading(path, &e))
}

/// A private key (or another secret), refused with `PermissionDenied` when its mode lets
/// other users read it.
pub fn read_secret(path: &Path) -> io::Result<String> {
    let mode = std::fs::metadata(path)
        .map_err(|e| reading(path, &e))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "refusing the key {}: its mode {:o} lets other users read it (chmod 600 it)",
                path.display(),
                mode & 0o777
            ),
        ));
    }
    read_public(path)
}

fn reading(path: &Path, e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("reading {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_others_can_read_are_refused() {
        let dir = tempfile::tempdir().expect("scratch directory");
        let key = dir.path().join("client.key");
        std::fs::write(&key, "secret").expect("write");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        let err = read_secret(&key).expect_err("group-readable");
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(
            err.to_string(),
            format!(
                "refusing the key {}: its mode 640 lets other users read it (chmod 600 it)",
                key.display()
            )
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_eq!(read_secret(&key).expect("private"), "secret");

        let missing = dir.path().join("missing.crt");
        let err = read_public(&missing).expect_err("missing");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(
            err.to_string()
                .starts_with(&format!("reading {}: ", missing.display())),
            "{err}"
        );
    }
}
