//! `gpuctl cert list|revoke`.
//!
//! JSON (stable): a certificate is `{"serial", "subject" ("node 3", "client admin", or "" for a
//! revoked serial the cluster never issued), "not_after_ms", "issued_at_ms", "revoked",
//! "revoked_reason"}`; both verbs print an array of them.

use gpu_proto::v1 as pb;
use gpu_proto::v1::cert_service_client::CertServiceClient;
use serde_json::{Value, json};

use super::{Answer, Ctx, Failure};
use crate::cli::{CertVerb, Output};
use crate::output::{self, table};
use crate::units;

pub async fn run(ctx: &Ctx, verb: CertVerb) -> Result<Answer, Failure> {
    let certs = match verb {
        CertVerb::List => {
            ctx.endpoints
                .call(|ch| async move {
                    Ok(CertServiceClient::new(ch)
                        .list_certificates(pb::ListCertificatesRequest {})
                        .await?
                        .into_inner()
                        .certificates)
                })
                .await?
        }
        CertVerb::Revoke { serial, reason } => {
            let req = pb::RevokeCertificateRequest { serial, reason };
            let cert = ctx
                .endpoints
                .call(|ch| {
                    let req = req.clone();
                    async move {
                        Ok(CertServiceClient::new(ch)
                            .revoke_certificate(req)
                            .await?
                            .into_inner())
                    }
                })
                .await?;
            vec![cert]
        }
    };
    Ok(Answer::ok(render(ctx, &certs)))
}

fn render(ctx: &Ctx, certs: &[pb::CertificateRecord]) -> String {
    match ctx.output {
        Output::Json => output::json(&Value::Array(
            certs
                .iter()
                .map(|c| {
                    json!({
                        "serial": c.serial,
                        "subject": c.subject,
                        "not_after_ms": c.not_after_ms,
                        "issued_at_ms": c.issued_at_ms,
                        "revoked": c.revoked,
                        "revoked_reason": c.revoked_reason,
                    })
                })
                .collect(),
        )),
        Output::Table => {
            let rows: Vec<Vec<String>> = certs
                .iter()
                .map(|c| {
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
                        expiry(c.not_after_ms),
                    ]
                })
                .collect();
            table(&["SERIAL", "SUBJECT", "STATE", "EXPIRES IN"], &rows)
        }
    }
}

/// Time left until `not_after_ms`, roughly.
fn expiry(not_after_ms: u64) -> String {
    if not_after_ms == 0 {
        return "-".into();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    match not_after_ms.checked_sub(now) {
        None => "expired".into(),
        Some(ms) => units::format_duration(std::time::Duration::from_secs(ms / 1000)),
    }
}
