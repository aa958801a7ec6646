//! `gpuctl cert list|revoke`.
//!
//! JSON (stable): a certificate is `{"serial", "subject" ("node 3", "client admin", or "" for a
//! revoked serial the cluster never issued), "not_after_ms", "issued_at_ms", "revoked",
//! "revoked_reason", "issuer" (the signing CA's key id; "" before the first CA rotation)}`;
//! both verbs print an array of them.

use gpu_proto::v1 as pb;
use gpu_proto::v1::cert_service_client::CertServiceClient;
use serde_json::{Value, json};

use super::{Answer, Ctx, Failure};
use crate::cli::CertVerb;
use crate::output::table_of;
use crate::units;

pub(crate) async fn run(ctx: &Ctx, verb: CertVerb) -> Result<Answer, Failure> {
    let new = CertServiceClient::new;
    let certs = match verb {
        CertVerb::Request { out_dir } => return request(ctx, &out_dir).await,
        CertVerb::Ca(verb) => return super::cert_ca::run(ctx, verb).await,
        CertVerb::List => {
            let req = pb::ListCertificatesRequest {};
            ctx.call(new, req, async |mut c, r| c.list_certificates(r).await)
                .await?
                .certificates
        }
        CertVerb::Revoke { serial, reason } => {
            let req = pb::RevokeCertificateRequest { serial, reason };
            let cert = ctx
                .call(new, req, async |mut c, r| c.revoke_certificate(r).await)
                .await?;
            vec![cert]
        }
    };
    Ok(ctx.answer_list(&certs, cert_json, certs_table))
}

/// `cert request`: key and signing request here, signature from the cluster, files in `dir`.
async fn request(ctx: &Ctx, dir: &std::path::Path) -> Result<Answer, Failure> {
    let key = rcgen::KeyPair::generate().map_err(|e| Failure::Usage(e.to_string()))?;
    let csr_pem = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .and_then(|csr| csr.pem())
        .map_err(|e| Failure::Usage(e.to_string()))?;
    let req = pb::IssueClientCertificateRequest { csr_pem };
    let reply = ctx
        .call(CertServiceClient::new, req, async |mut c, r| {
            c.issue_client_certificate(r).await
        })
        .await?;
    let (cert, key_file) = (dir.join("client.crt"), dir.join("client.key"));
    write(&key_file, &key.serialize_pem(), 0o600)?;
    write(&cert, &reply.cert_pem, 0o644)?;
    eprintln!(
        "wrote {} and {}; use them with --cert-file/--key-file (or cert_file/key_file in the \
         gpuctl config)",
        cert.display(),
        key_file.display()
    );
    Ok(ctx.answer(
        || {
            json!({
                "cert_file": cert.display().to_string(),
                "key_file": key_file.display().to_string(),
            })
        },
        || format!("{}\n{}\n", cert.display(), key_file.display()),
    ))
}

/// Create `path` with `mode` from the start (a key is never readable by others, even briefly).
fn write(path: &std::path::Path, text: &str, mode: u32) -> Result<(), Failure> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e: std::io::Error| Failure::Usage(format!("writing {}: {e}", path.display()));
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(fail)?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(fail)
}

fn cert_json(c: &pb::CertificateRecord) -> Value {
    json!({
        "serial": c.serial,
        "subject": c.subject,
        "not_after_ms": c.not_after_ms,
        "issued_at_ms": c.issued_at_ms,
        "revoked": c.revoked,
        "revoked_reason": c.revoked_reason,
        "issuer": c.issuer,
    })
}

fn certs_table(certs: &[pb::CertificateRecord]) -> String {
    table_of(&["SERIAL", "SUBJECT", "STATE", "EXPIRES IN"], certs, |c| {
        vec![
            c.serial.clone(),
            if c.subject.is_empty() {
                "-".into()
            } else {
                c.subject.clone()
            },
            if c.revoked {
                format!("revoked {}", c.revoked_reason)
                    .trim_end()
                    .to_owned()
            } else {
                "valid".into()
            },
            units::time_left(c.not_after_ms),
        ]
    })
}
