//! `gpu-agent restore`: build the first member of a new cluster from a backup (`gpuctl cluster
//! snapshot save`) after the old cluster lost its majority for good. The backup is verified
//! before anything is written; the data directory must be empty. The new cluster gets a new CA
//! (old certificates are not trusted); tokens, jobs, tenants, nodes and the audit log come back
//! as they were, so old join and admin tokens keep working.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use gpu_raft_store::NodeId;

use crate::leader::audit_signer::verify_chain;
use crate::tls::files::write_file;
use crate::tls::signature::TrustedSigners;
use crate::tls::{Subject, TlsDir, enroll, pki};

/// `gpu-agent restore`'s options (also its command line).
#[derive(Clone, Debug, clap::Args)]
pub struct RestoreOptions {
    /// The backup file.
    #[arg(long)]
    pub from: PathBuf,
    /// A new, empty data directory for the restored agent.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The restored agent's node id.
    #[arg(long)]
    pub node_id: NodeId,
    /// The address the restored agent will listen on and advertise.
    #[arg(long)]
    pub advertise: String,
    /// Where to write the new cluster CA certificate and an admin client certificate
    /// (ca.crt, admin.crt, admin.key); the files must not exist yet.
    #[arg(long)]
    pub credentials_dir: PathBuf,
    /// The old cluster's CA certificate (repeatable): the backup's audit chain must verify
    /// against its signed heads (a backup whose chain was rewritten is refused), and the new
    /// cluster keeps trusting heads it signed. Without it, `gpuctl audit verify` on the new
    /// cluster needs `--trust` with the old CA.
    #[arg(long, value_name = "CA_FILE")]
    pub trust_audit_ca: Vec<PathBuf>,
    /// Lifetime of the restored agent's certificate.
    #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
    pub cert_validity: Duration,
}

/// What was restored, for the operator.
#[derive(Debug)]
pub struct Restored {
    pub index: u64,
    pub cluster_id: String,
    pub jobs: usize,
    pub nodes: usize,
}

pub async fn run(o: &RestoreOptions) -> anyhow::Result<Restored> {
    anyhow::ensure!(o.node_id >= 1, "--node-id must be at least 1");
    let bytes = std::fs::read(&o.from).with_context(|| format!("reading {}", o.from.display()))?;
    let (header, mut state) = gpu_raft_store::backup::decode(&bytes)
        .with_context(|| format!("refusing {}", o.from.display()))?;
    state.audit_signers = trusted_audit_signers(o, &state)?;
    gpu_raft_store::backup::mark_restored(&mut state, &header, crate::clock::now_ms());
    let tls_dir = TlsDir::in_data_dir(&o.data_dir);
    if tls_dir.dir.exists() {
        bail!(
            "{} already holds TLS material; restore into an empty data directory (nothing was changed)",
            o.data_dir.display()
        );
    }
    for name in ["ca.crt", "admin.crt", "admin.key"] {
        let path = o.credentials_dir.join(name);
        if path.exists() {
            bail!(
                "{} exists; choose an empty --credentials-dir (nothing was changed)",
                path.display()
            );
        }
    }
    // Everything else that can fail without touching the disk first.
    let material = enroll::bootstrap(o.node_id, o.cert_validity)?;
    let ca = material
        .signing_ca()
        .context("a new CA comes with its key")?;
    let admin = pki::issue(
        &ca,
        &Subject::Client("admin".into()),
        SystemTime::now(),
        enroll::CLIENT_VALIDITY,
    )?;
    let restored = Restored {
        index: header.index,
        cluster_id: header.cluster_id.clone(),
        jobs: state.jobs.len(),
        nodes: state.nodes.len(),
    };
    gpu_raft_store::backup::seed(&o.data_dir, o.node_id, &o.advertise, state, header.index)
        .await
        .with_context(|| format!("restoring into {}", o.data_dir.display()))?;
    tls_dir.store(&material)?;
    std::fs::create_dir_all(&o.credentials_dir)
        .with_context(|| format!("creating {}", o.credentials_dir.display()))?;
    write_file(
        &o.credentials_dir.join("ca.crt"),
        &material.ca_cert_pem,
        0o644,
    )?;
    write_file(&o.credentials_dir.join("admin.key"), &admin.key_pem, 0o600)?;
    write_file(&o.credentials_dir.join("admin.crt"), &admin.cert_pem, 0o644)?;
    Ok(restored)
}

/// The CA certificates given with `--trust-audit-ca`, once the backup's audit chain verified
/// against them. They replace whatever the backup says it trusts: trust comes from the
/// operator, not from the file being checked.
fn trusted_audit_signers(
    o: &RestoreOptions,
    state: &gpu_raft_store::ClusterState,
) -> anyhow::Result<Vec<String>> {
    if o.trust_audit_ca.is_empty() {
        return Ok(Vec::new());
    }
    let pems = o
        .trust_audit_ca
        .iter()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())))
        .collect::<anyhow::Result<Vec<String>>>()?;
    let trusted = TrustedSigners::of(pems.iter().map(String::as_str))?;
    let refuse = |problem: String| {
        anyhow::anyhow!(
            "refusing {}: its audit log does not verify: {problem} (nothing was changed)",
            o.from.display()
        )
    };
    let coverage = verify_chain(state, &trusted).map_err(refuse)?;
    // The signer signs within seconds of a write: a backup of a cluster that wrote something
    // without a single signed head had its heads removed.
    if coverage.signed_through == 0 && !state.audit.is_empty() {
        return Err(refuse(
            "no head signed by the given CA covers any of its entries".into(),
        ));
    }
    Ok(pems)
}
