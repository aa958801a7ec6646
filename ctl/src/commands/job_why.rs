//! `gpuctl job why JOB`: why a job is pending, its queue position and estimated start.
//!
//! JSON (stable): `{"id", "state" (as in `job get`), "reason" (the scheduler's recorded reason,
//! "" when none yet), "queue_position" (1-based among pending jobs in the policy's order; 0
//! when not pending), "pending_jobs", "jobs_ahead", "estimated_start_ms" (null when there is
//! no estimate; for a job that is not pending, when it started), "estimate_note" (how it was
//! estimated or why not), "policy"}`. Exit 0 whatever the job's state; 2 on errors (e.g. an
//! unknown job).

use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;
use serde_json::json;

use super::job_view::state_name;
use super::{Answer, Ctx, Failure};
use crate::output::fields;
use crate::units;

pub(super) async fn run(ctx: &Ctx, id: u64, stale: bool, now_ms: u64) -> Result<Answer, Failure> {
    let req = pb::ExplainJobRequest { id, stale };
    let e = ctx
        .call(JobServiceClient::new, req, async |mut c, r| {
            c.explain_job(r).await
        })
        .await?;
    Ok(ctx.answer(|| explanation_json(&e), || explanation_text(&e, now_ms)))
}

fn state(e: &pb::JobExplanation) -> &'static str {
    state_name(pb::JobState::try_from(e.state).unwrap_or(pb::JobState::Unspecified))
}

fn explanation_json(e: &pb::JobExplanation) -> serde_json::Value {
    json!({
        "id": e.job_id,
        "state": state(e),
        "reason": e.reason,
        "queue_position": e.queue_position,
        "pending_jobs": e.pending_jobs,
        "jobs_ahead": e.queue_position.saturating_sub(1),
        "estimated_start_ms": e.estimated_start_ms,
        "estimate_note": e.estimate_note,
        "policy": e.policy,
    })
}

fn explanation_text(e: &pb::JobExplanation, now_ms: u64) -> String {
    let pending = e.queue_position > 0;
    let mut pairs = vec![
        ("Job", format!("j-{}", e.job_id)),
        ("State", state(e).to_owned()),
    ];
    if !e.reason.is_empty() {
        pairs.push(("Reason", e.reason.clone()));
    }
    if pending {
        pairs.push((
            "Queue",
            format!(
                "{} of {} pending ({} ahead, {} order)",
                e.queue_position,
                e.pending_jobs,
                e.queue_position - 1,
                e.policy
            ),
        ));
    }
    let start = match e.estimated_start_ms {
        Some(at) if at > now_ms => format!(
            "{} (in {}), {}",
            units::rfc3339(at),
            units::format_duration(std::time::Duration::from_millis(at - now_ms)),
            e.estimate_note
        ),
        Some(at) => format!("{}, {}", units::rfc3339(at), e.estimate_note),
        None => e.estimate_note.clone(),
    };
    pairs.push((if pending { "Expected start" } else { "Started" }, start));
    fields(&pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending() -> pb::JobExplanation {
        pb::JobExplanation {
            job_id: 7,
            state: pb::JobState::Pending as i32,
            reason: "over quota: tenant a holds 2 of its 2 A100 GPUs (2 guaranteed + 0 borrowed) and needs 1 more".into(),
            queue_position: 3,
            pending_jobs: 5,
            estimated_start_ms: Some(1_700_000_060_000),
            estimate_note: "if every running job ends at its estimate and nothing new is submitted".into(),
            policy: "fcfs+easy".into(),
        }
    }

    #[test]
    fn renders_a_pending_job() {
        let text = explanation_text(&pending(), 1_700_000_000_000);
        expect_test::expect![[r#"
            Job:             j-7
            State:           pending
            Reason:          over quota: tenant a holds 2 of its 2 A100 GPUs (2 guaranteed + 0 borrowed) and needs 1 more
            Queue:           3 of 5 pending (2 ahead, fcfs+easy order)
            Expected start:  2023-11-14T22:14:20Z (in 1m), if every running job ends at its estimate and nothing new is submitted
        "#]]
        .assert_eq(&text);
        let j = explanation_json(&pending());
        assert_eq!(j["jobs_ahead"], 2);
        assert_eq!(j["state"], "pending");
        let none = pb::JobExplanation {
            estimated_start_ms: None,
            ..pending()
        };
        assert_eq!(
            explanation_json(&none)["estimated_start_ms"],
            serde_json::Value::Null
        );
    }
}
