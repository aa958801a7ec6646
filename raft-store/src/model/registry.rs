//! Tenants' container registry logins, sealed. The replicated state keeps only the username and
//! the password sealed by an agent's edge (AEAD under a key derived from the cluster CA key,
//! which only voters hold; see the agent's `secrets.rs`): no log entry, snapshot, backup or
//! listing carries the password in plain text, and `Debug` shows none of the sealed bytes.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::container;

/// The most registries one tenant keeps a login for.
pub const MAX_REGISTRY_CREDENTIALS: usize = 16;
/// The longest sealed password (hex), well above what a registry token needs.
const MAX_SEALED_LEN: usize = 16 * 1024;

/// A tenant's login at one registry, its password sealed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedCredential {
    pub username: String,
    /// Hex of nonce, ciphertext and tag.
    pub sealed: String,
    /// Which key sealed it (the SHA-256 of the CA certificate, hex): a credential sealed under
    /// another CA (a cluster restored from backup) cannot be opened and must be set again.
    pub key_id: String,
    /// When it was set (the log entry's time).
    #[serde(default)]
    pub set_at_ms: u64,
}

impl fmt::Debug for SealedCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealedCredential")
            .field("username", &self.username)
            .field("sealed", &"<sealed>")
            .field("key_id", &self.key_id)
            .field("set_at_ms", &self.set_at_ms)
            .finish()
    }
}

/// A registry as images name it: a host with an optional port (`nvcr.io`, `localhost:5000`),
/// or `docker.io` for images that name none.
pub fn registry(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 255 {
        return Err(format!("registry {name:?} must be 1..=255 characters"));
    }
    container::registry_host(name).map_err(|e| format!("registry {name:?}: {e}"))
}

/// The registry `image` is pulled from: its first path component when that names a host (it
/// has a `.` or a `:`, or is `localhost`), else `docker.io`.
pub fn registry_of(image: &str) -> String {
    let canonical = container::canonical_image(image);
    canonical
        .split('/')
        .next()
        .unwrap_or("docker.io")
        .to_owned()
}

/// What `apply` checks of a credential to keep.
pub fn validate(registry_name: &str, c: &SealedCredential) -> Result<(), String> {
    registry(registry_name)?;
    if c.username.is_empty()
        || c.username.len() > 255
        || c.username.chars().any(|ch| ch.is_control() || ch == ':')
    {
        return Err("a registry username must be 1..=255 printable characters without ':'".into());
    }
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(&c.sealed) || c.sealed.len() > MAX_SEALED_LEN {
        return Err("a sealed registry password must be hex, at most 16 KiB".into());
    }
    if !hex(&c.key_id) || c.key_id.len() != 64 {
        return Err("a sealed credential's key id must be 64 hex digits".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_name_their_registry() {
        for (image, reg) in [
            ("busybox", "docker.io"),
            ("team/img:1", "docker.io"),
            ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io"),
            ("localhost:5000/x", "localhost:5000"),
            ("localhost/x:1", "localhost"),
        ] {
            assert_eq!(registry_of(image), reg, "{image}");
        }
    }

    #[test]
    fn debug_shows_no_sealed_bytes() {
        let c = SealedCredential {
            username: "robot".into(),
            sealed: "deadbeef".into(),
            key_id: "ab".repeat(32),
            set_at_ms: 1,
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("deadbeef"), "{shown}");
        assert!(shown.contains("robot"), "{shown}");
    }
}
