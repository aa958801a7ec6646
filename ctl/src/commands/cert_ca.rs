//! `gpuctl cert ca status|bundle|introduce|switch|retire`: the cluster CA and its rotation.
//!
//! JSON (stable): `{"cas": [{"key_id", "name", "not_after_ms", "role" ("signing",
//! "introduced", "old")}], "not_installed": [node ids], "old_certificates": ["client admin
//! (0a1b…)"]}`; `bundle` prints the PEM itself.

use gpu_proto::v1 as pb;
use gpu_proto::v1::cert_service_client::CertServiceClient;
use serde_json::json;

use super::{Answer, Ctx, Failure};
use crate::cli::CaVerb;
use crate::output::table_of;
use crate::units;

pub(crate) async fn run(ctx: &Ctx, verb: CaVerb) -> Result<Answer, Failure> {
    let new = CertServiceClient::new;
    let step = |step: pb::CaStep, key_id: Option<String>, skip_down: bool| pb::RotateCaRequest {
        step: step.into(),
        key_id: key_id.unwrap_or_default(),
        skip_down,
    };
    let rotate = async |req| {
        ctx.call(new, req, async |mut c, r| c.rotate_ca(r).await)
            .await
    };
    let status = match &verb {
        CaVerb::Status | CaVerb::Bundle { .. } => {
            let req = pb::GetCaStatusRequest {};
            ctx.call(new, req, async |mut c, r| c.get_ca_status(r).await)
                .await?
        }
        CaVerb::Introduce => rotate(step(pb::CaStep::Introduce, None, false)).await?,
        CaVerb::Switch { skip_down } => rotate(step(pb::CaStep::Switch, None, *skip_down)).await?,
        CaVerb::Retire { key_id, skip_down } => {
            rotate(step(pb::CaStep::Retire, key_id.clone(), *skip_down)).await?
        }
    };
    if let CaVerb::Bundle { out } = verb {
        return bundle(&status.bundle_pem, out.as_deref());
    }
    Ok(ctx.answer(|| status_json(&status), || status_text(&status)))
}

/// The bundle on stdout, or in `out` (replaced whole: write, then rename).
fn bundle(pem: &str, out: Option<&std::path::Path>) -> Result<Answer, Failure> {
    let Some(path) = out else {
        return Ok(Answer::ok(pem.to_owned()));
    };
    let fail = |e: std::io::Error| Failure::Usage(format!("writing {}: {e}", path.display()));
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, pem)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(fail)?;
    Ok(Answer::ok(format!("{}\n", path.display())))
}

fn status_json(s: &pb::CaStatus) -> serde_json::Value {
    let cas: Vec<_> = s
        .cas
        .iter()
        .map(|c| {
            json!({
                "key_id": c.key_id,
                "name": c.name,
                "not_after_ms": c.not_after_ms,
                "role": c.role,
            })
        })
        .collect();
    json!({
        "cas": cas,
        "not_installed": s.not_installed,
        "old_certificates": s.old_certificates,
    })
}

fn status_text(s: &pb::CaStatus) -> String {
    let mut text = table_of(&["KEY ID", "NAME", "ROLE", "EXPIRES IN"], &s.cas, |c| {
        vec![
            c.key_id.get(..16).unwrap_or(&c.key_id).to_owned(),
            c.name.clone(),
            c.role.clone(),
            units::time_left(c.not_after_ms),
        ]
    });
    if !s.not_installed.is_empty() {
        let ids: Vec<String> = s.not_installed.iter().map(|id| format!("n{id}")).collect();
        text += &format!("not installed on: {}\n", ids.join(", "));
    }
    if !s.old_certificates.is_empty() {
        text += &format!("in use from an old CA: {}\n", s.old_certificates.join(", "));
    }
    text
}
