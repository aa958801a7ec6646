//! `gpuctl scheduler status|policy set`.
//!
//! JSON (stable): both print `{"policy": {"spec", "ordering", "backfill", "aging_per_hour",
//! "fairshare_weight", "usage_half_life_s", "preemption" ("off"|"reclaim"|"priority"),
//! "gang_wait_limit_s" (0: off), "preempt_exempt_s" (0: off)},
//! "pending_jobs", "running_jobs", "gpus_total", "gpus_free", "accuracy": {"jobs", "estimates",
//! "predictions"}}`, each of `estimates` and `predictions` being `{"count",
//! "median_relative_error", "within_2x"}` over the succeeded jobs the state holds (`policy set`
//! prints the status after the change).

use gpu_proto::v1 as pb;
use gpu_proto::v1::scheduler_service_client::SchedulerServiceClient;
use serde_json::{Value, json};

use super::{Answer, Ctx, Failure};
use crate::cli::{SchedulerPolicyVerb, SchedulerVerb};
use crate::output::table;
use crate::units;

pub(crate) async fn run(ctx: &Ctx, verb: SchedulerVerb) -> Result<Answer, Failure> {
    let new = SchedulerServiceClient::new;
    let status = match verb {
        SchedulerVerb::Status { stale } => {
            let req = pb::GetSchedulerStatusRequest { stale };
            ctx.call(new, req, async |mut c, r| c.get_scheduler_status(r).await)
                .await?
        }
        SchedulerVerb::Policy(SchedulerPolicyVerb::Set {
            policy,
            aging_per_hour,
            fairshare_weight,
            usage_half_life,
            preemption,
            gang_wait_limit,
            preempt_exempt,
        }) => {
            let req = pb::SetSchedulerPolicyRequest {
                policy,
                aging_per_hour,
                fairshare_weight,
                usage_half_life_s: usage_half_life,
                preemption,
                gang_wait_limit_s: gang_wait_limit,
                preempt_exempt_s: preempt_exempt,
            };
            ctx.call(new, req, async |mut c, r| c.set_scheduler_policy(r).await)
                .await?
        }
    };
    Ok(ctx.answer(|| status_json(&status), || status_table(&status)))
}

fn status_json(s: &pb::SchedulerStatus) -> Value {
    let p = s.policy.clone().unwrap_or_default();
    let a = s.accuracy.unwrap_or_default();
    json!({
        "policy": {
            "spec": p.spec,
            "ordering": p.ordering,
            "backfill": p.backfill,
            "aging_per_hour": p.aging_per_hour,
            "fairshare_weight": p.fairshare_weight,
            "usage_half_life_s": p.usage_half_life_s,
            "preemption": p.preemption,
            "gang_wait_limit_s": p.gang_wait_limit_s,
            "preempt_exempt_s": p.preempt_exempt_s,
        },
        "pending_jobs": s.pending_jobs,
        "running_jobs": s.running_jobs,
        "gpus_total": s.gpus_total,
        "gpus_free": s.gpus_free,
        "accuracy": {
            "jobs": a.jobs,
            "estimates": errors_json(&a.estimates.unwrap_or_default()),
            "predictions": errors_json(&a.predictions.unwrap_or_default()),
        },
    })
}

fn errors_json(e: &pb::GuessErrors) -> Value {
    json!({
        "count": e.count,
        "median_relative_error": e.median_relative_error,
        "within_2x": e.within_2x,
    })
}

/// "38% median error, 71% within 2x (of 120 jobs)", or "none yet".
fn errors_text(e: Option<&pb::GuessErrors>) -> String {
    match e {
        Some(e) if e.count > 0 => format!(
            "{:.0}% median error, {:.0}% within 2x (of {} jobs)",
            e.median_relative_error * 100.0,
            e.within_2x * 100.0,
            e.count
        ),
        _ => "none yet".into(),
    }
}

fn status_table(s: &pb::SchedulerStatus) -> String {
    let p = s.policy.clone().unwrap_or_default();
    let a = s.accuracy.unwrap_or_default();
    let rows = vec![
        vec!["policy".into(), p.spec],
        vec!["aging per hour".into(), p.aging_per_hour.to_string()],
        vec!["fair-share weight".into(), p.fairshare_weight.to_string()],
        vec![
            "usage half-life".into(),
            units::format_duration(std::time::Duration::from_secs(p.usage_half_life_s)),
        ],
        vec!["preemption".into(), p.preemption],
        vec![
            "gang wait limit".into(),
            match p.gang_wait_limit_s {
                0 => "off".into(),
                s => units::format_duration(std::time::Duration::from_secs(s)),
            },
        ],
        vec![
            "preempt exempt".into(),
            match p.preempt_exempt_s {
                0 => "off".into(),
                s => units::format_duration(std::time::Duration::from_secs(s)),
            },
        ],
        vec!["pending jobs".into(), s.pending_jobs.to_string()],
        vec!["running jobs".into(), s.running_jobs.to_string()],
        vec![
            "free GPUs".into(),
            format!("{} of {}", s.gpus_free, s.gpus_total),
        ],
        vec![
            "users' runtime estimates".into(),
            errors_text(a.estimates.as_ref()),
        ],
        vec![
            "runtime predictions".into(),
            errors_text(a.predictions.as_ref()),
        ],
    ];
    table(&["FIELD", "VALUE"], &rows)
}
