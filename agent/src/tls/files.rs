//! The agent's TLS material on disk, `<data_dir>/tls/`: `ca.crt` (the CAs it trusts: one, or
//! two while the CA is rotated), `node.crt`, `node.key`, and on the agents that sign
//! certificates (the voters) `ca.key`, the signing CA's key, and during a rotation
//! `ca.next.key`, the introduced CA's. Keys are written 0600 (atomically: temp file, fsync,
//! rename) and refused when other users could read them.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use gpu_proto::tls::{read_public, read_secret};

use super::pki::{self, KeyedCert};
use super::signature;

/// Everything an agent needs to speak TLS as itself, and to sign when it is a signer.
#[derive(Clone)]
pub struct NodeTls {
    /// The CA certificates this agent trusts (PEM): the cluster's CA, or two while it is
    /// rotated.
    pub ca_cert_pem: String,
    /// The signing CA's private key: on the agents that sign certificates (voters), none
    /// elsewhere.
    pub ca_key_pem: Option<String>,
    /// The private key of a CA introduced to replace the signing one (voters, during a
    /// rotation).
    pub next_ca_key_pem: Option<String>,
    pub node: KeyedCert,
}

impl NodeTls {
    /// Material without CA keys (a learner's, an edge agent's, a joiner's).
    pub fn keyless(ca_cert_pem: String, node: KeyedCert) -> Self {
        Self {
            ca_cert_pem,
            ca_key_pem: None,
            next_ca_key_pem: None,
            node,
        }
    }

    /// The signing CA with its key, when this agent holds the key.
    pub fn signing_ca(&self) -> Option<KeyedCert> {
        self.ca_key_pem
            .as_ref()
            .and_then(|key| keyed(&self.ca_cert_pem, key))
    }

    /// The introduced CA with its key, when this agent holds the key.
    pub fn next_ca(&self) -> Option<KeyedCert> {
        self.next_ca_key_pem
            .as_ref()
            .and_then(|key| keyed(&self.ca_cert_pem, key))
    }

    /// The key id of the signing CA, when this agent holds its key.
    pub fn signing_key_id(&self) -> Result<Option<String>, pki::PkiError> {
        key_id_of(self.signing_ca())
    }

    /// The key id of the introduced CA, when this agent holds its key.
    pub fn next_key_id(&self) -> Result<Option<String>, pki::PkiError> {
        key_id_of(self.next_ca())
    }

    /// The key ids of the CAs this agent trusts.
    pub fn trusted_key_ids(&self) -> std::collections::BTreeSet<String> {
        pki::certs_in(&self.ca_cert_pem)
            .iter()
            .filter_map(|pem| signature::key_id(pem).ok())
            .collect()
    }
}

fn key_id_of(ca: Option<KeyedCert>) -> Result<Option<String>, pki::PkiError> {
    ca.map(|c| signature::key_id(&c.cert_pem)).transpose()
}

/// The certificate of `bundle` that `key_pem` is the key of, with the key.
fn keyed(bundle: &str, key_pem: &str) -> Option<KeyedCert> {
    pki::certs_in(bundle)
        .into_iter()
        .find(|cert| pki::key_matches(cert, key_pem))
        .map(|cert_pem| KeyedCert {
            cert_pem,
            key_pem: key_pem.to_owned(),
        })
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls")
            .field("signer", &self.ca_key_pem.is_some())
            .field("next_ca_key", &self.next_ca_key_pem.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug)]
pub struct TlsDir {
    pub dir: PathBuf,
}

impl TlsDir {
    pub fn in_data_dir(data_dir: &Path) -> Self {
        Self {
            dir: data_dir.join("tls"),
        }
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The stored material, or `None` when this agent has none yet (before bootstrap or join).
    pub fn load(&self) -> anyhow::Result<Option<NodeTls>> {
        self.recover()?;
        let paths = [
            self.ca_cert(),
            self.dir.join("node.crt"),
            self.dir.join("node.key"),
        ];
        let present = paths.iter().filter(|p| p.exists()).count();
        if present == 0 {
            return Ok(None);
        }
        if present < paths.len() {
            bail!(
                "{} is incomplete (it needs ca.crt, node.crt and node.key): restore it from a \
                 backup or remove it and join the node again",
                self.dir.display()
            );
        }
        let key = |name: &str| {
            let path = self.dir.join(name);
            path.exists().then(|| read_secret(&path)).transpose()
        };
        Ok(Some(NodeTls {
            ca_cert_pem: read_public(&paths[0])?,
            ca_key_pem: key("ca.key")?,
            next_ca_key_pem: key("ca.next.key")?,
            node: KeyedCert {
                cert_pem: read_public(&paths[1])?,
                key_pem: read_secret(&paths[2])?,
            },
        }))
    }

    /// Replace the stored material as a whole: the new set is written and fsynced in
    /// `tls.new/`, then swapped in by two renames, so a crash at any point leaves either the old
    /// set or the new one (`load` finishes an interrupted swap), never a mix.
    pub fn store(&self, tls: &NodeTls) -> anyhow::Result<()> {
        let (new, old) = (self.sibling("new"), self.sibling("old"));
        if new.exists() {
            std::fs::remove_dir_all(&new)?;
        }
        std::fs::create_dir_all(&new).with_context(|| format!("creating {}", new.display()))?;
        std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o700))?;
        write_file(&new.join("ca.crt"), &tls.ca_cert_pem, 0o644)?;
        if let Some(key) = &tls.ca_key_pem {
            write_file(&new.join("ca.key"), key, 0o600)?;
        }
        if let Some(key) = &tls.next_ca_key_pem {
            write_file(&new.join("ca.next.key"), key, 0o600)?;
        }
        write_file(&new.join("node.key"), &tls.node.key_pem, 0o600)?;
        write_file(&new.join("node.crt"), &tls.node.cert_pem, 0o644)?;
        if self.dir.exists() {
            std::fs::rename(&self.dir, &old)?;
        }
        std::fs::rename(&new, &self.dir)?;
        sync_parent(&self.dir)?;
        if old.exists() {
            std::fs::remove_dir_all(&old)?;
        }
        Ok(())
    }

    /// Finish or undo a swap a crash interrupted: a complete `tls/` wins; without one, the
    /// previous set (`tls.old/`) is put back; a half-written `tls.new/` is dropped.
    fn recover(&self) -> anyhow::Result<()> {
        let (new, old) = (self.sibling("new"), self.sibling("old"));
        if !self.dir.exists() && old.exists() {
            std::fs::rename(&old, &self.dir)?;
        }
        for leftover in [new, old] {
            if leftover.exists() {
                std::fs::remove_dir_all(&leftover)
                    .with_context(|| format!("removing {}", leftover.display()))?;
            }
        }
        Ok(())
    }

    fn sibling(&self, suffix: &str) -> PathBuf {
        self.dir.with_extension(suffix)
    }
}

/// Write `text` to `path` with `mode`, atomically and durably.
pub fn write_file(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", tmp.display()))?;
    file.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming onto {}", path.display()))?;
    sync_parent(path)
}

fn sync_parent(path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::pki;

    #[test]
    fn material_round_trips_and_keys_are_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tls_dir = TlsDir::in_data_dir(dir.path());
        assert!(tls_dir.load().expect("empty").is_none());
        let now = std::time::SystemTime::now();
        let ca = pki::new_ca(now, std::time::Duration::from_secs(3600)).expect("ca");
        let node = pki::issue(
            &ca,
            &pki::Subject::Node(1),
            now,
            std::time::Duration::from_secs(60),
        )
        .expect("node");
        let signer = NodeTls {
            ca_key_pem: Some(ca.key_pem.clone()),
            ..NodeTls::keyless(ca.cert_pem.clone(), node.clone())
        };
        // Without the CA key (a learner): no ca.key, and it loads as such.
        tls_dir
            .store(&NodeTls {
                ca_key_pem: None,
                ..signer.clone()
            })
            .expect("store");
        assert!(!tls_dir.dir.join("ca.key").exists());
        let loaded = tls_dir.load().expect("load").expect("present");
        assert!(loaded.ca_key_pem.is_none() && loaded.signing_ca().is_none());
        tls_dir.store(&signer).expect("store");
        let loaded = tls_dir.load().expect("load").expect("present");
        assert!(loaded.node.cert_pem.contains("BEGIN CERTIFICATE"));
        assert_eq!(loaded.ca_key_pem.as_deref(), Some(ca.key_pem.as_str()));
        assert!(loaded.next_ca_key_pem.is_none());

        // During a rotation: two CAs trusted, the next one's key kept beside the signing one.
        let next = pki::new_ca(now, std::time::Duration::from_secs(3600)).expect("next ca");
        tls_dir
            .store(&NodeTls {
                ca_cert_pem: format!("{}{}", ca.cert_pem, next.cert_pem),
                next_ca_key_pem: Some(next.key_pem.clone()),
                ..signer.clone()
            })
            .expect("store");
        let loaded = tls_dir.load().expect("load").expect("present");
        assert_eq!(loaded.trusted_key_ids().len(), 2);
        let signing = loaded.signing_ca().expect("signing");
        assert_eq!(signing.cert_pem.trim(), ca.cert_pem.trim());
        assert_eq!(
            loaded.next_ca().expect("next").cert_pem.trim(),
            next.cert_pem.trim()
        );
        for key in ["ca.key", "ca.next.key", "node.key"] {
            let mode = std::fs::metadata(tls_dir.dir.join(key))
                .expect("stat")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{key}");
        }

        // A swap interrupted after the old set moved aside: the old set comes back.
        std::fs::rename(&tls_dir.dir, tls_dir.dir.with_extension("old")).expect("mv");
        std::fs::create_dir(tls_dir.dir.with_extension("new")).expect("half-written new set");
        assert!(tls_dir.load().expect("recovered").is_some());
        assert!(!tls_dir.dir.with_extension("new").exists());

        let key = tls_dir.dir.join("node.key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = tls_dir.load().expect_err("world-readable key");
        assert!(err.to_string().contains("chmod 600"), "{err:#}");

        std::fs::remove_file(&key).expect("rm");
        let err = tls_dir.load().expect_err("incomplete");
        assert!(err.to_string().contains("incomplete"), "{err:#}");
    }
}
