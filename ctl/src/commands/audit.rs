//! `gpuctl audit list|verify`.
//!
//! JSON (stable): `list` prints an array of `{"seq", "time_ms", "actor", "verb", "object",
//! "outcome", "request_id", "source", "prev_hash", "hash"}`; `verify` prints
//! `{"ok", "entries", "problem", "head_hash", "signed_through"}` and exits 1 when the chain is
//! broken or its signed heads do not hold.

use gpu_proto::v1 as pb;
use gpu_proto::v1::audit_service_client::AuditServiceClient;
use serde_json::{Value, json};

use super::{Answer, Ctx, Failure};
use crate::cli::AuditVerb;
use crate::output::table_of;

pub(crate) async fn run(ctx: &Ctx, verb: AuditVerb) -> Result<Answer, Failure> {
    let new = AuditServiceClient::new;
    match verb {
        AuditVerb::List { after, limit } => {
            let req = pb::ListAuditRequest { after, limit };
            let entries = ctx
                .call(new, req, async |mut c, r| c.list_audit(r).await)
                .await?
                .entries;
            Ok(ctx.answer_list(&entries, entry_json, entries_table))
        }
        AuditVerb::Verify { trust } => {
            let trust_ca_pem = trust
                .iter()
                .map(|path| {
                    std::fs::read_to_string(path).map_err(|e| {
                        Failure::Usage(format!("cannot read --trust {}: {e}", path.display()))
                    })
                })
                .collect::<Result<_, _>>()?;
            let req = pb::VerifyAuditRequest { trust_ca_pem };
            let v = ctx
                .call(new, req, async |mut c, r| c.verify_audit(r).await)
                .await?;
            let answer = ctx.answer(
                || {
                    json!({
                        "ok": v.ok,
                        "entries": v.entries,
                        "problem": v.problem,
                        "head_hash": v.head_hash,
                        "signed_through": v.signed_through,
                    })
                },
                || {
                    if v.ok {
                        format!(
                            "audit chain intact: {} entries, signed through entry {}, head {}\n",
                            v.entries, v.signed_through, v.head_hash
                        )
                    } else {
                        format!("audit chain BROKEN: {}\n", v.problem)
                    }
                },
            );
            Ok(Answer {
                positive: v.ok,
                ..answer
            })
        }
    }
}

fn entries_table(entries: &[pb::AuditEntry]) -> String {
    table_of(
        &[
            "SEQ", "TIME_MS", "ACTOR", "VERB", "OBJECT", "OUTCOME", "SOURCE",
        ],
        entries,
        |e| {
            vec![
                e.seq.to_string(),
                e.time_ms.to_string(),
                e.actor.clone(),
                e.verb.clone(),
                e.object.clone(),
                e.outcome.clone(),
                e.source.clone(),
            ]
        },
    )
}

fn entry_json(e: &pb::AuditEntry) -> Value {
    json!({
        "seq": e.seq,
        "time_ms": e.time_ms,
        "actor": e.actor,
        "verb": e.verb,
        "object": e.object,
        "outcome": e.outcome,
        "request_id": e.request_id,
        "source": e.source,
        "prev_hash": e.prev_hash,
        "hash": e.hash,
    })
}
