//! `gpuctl job list`: the jobs the agent selects by the filters, read page by page; with
//! `--watch`, then each matching job again whenever it changes (`WatchJobs`), as
//! `kubectl get --watch` does.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;

use super::job_view::{job_json, jobs_table, state_of};
use super::{Answer, Ctx, Failure, job_pages};
use crate::cli::JobListArgs;
use crate::cli::Output;
use crate::client::CallError;
use crate::output;
use crate::units::now_ms;

/// How far back `job list --finished` looks without `--since`.
const DEFAULT_FINISHED_SINCE: Duration = Duration::from_secs(24 * 3600);

pub(super) async fn run(ctx: &Ctx, args: JobListArgs) -> Result<Answer, Failure> {
    let req = request(&args, now_ms());
    if !args.watch {
        let jobs = job_pages::list_all(ctx, req).await?;
        return Ok(ctx.answer_list(&jobs, job_json, |jobs| jobs_table(jobs, now_ms())));
    }
    watch(ctx, req).await
}

/// The request for `args` at `now_ms`.
fn request(args: &JobListArgs, now_ms: u64) -> pb::ListJobsRequest {
    let ago = |d: Duration| now_ms.saturating_sub(d.as_millis() as u64);
    pb::ListJobsRequest {
        states: args.states.iter().map(|s| state_of(*s) as i32).collect(),
        node_id: args.node,
        tenant: args.tenant.clone().unwrap_or_default(),
        user: args.user.clone().unwrap_or_default(),
        name: args.name.clone().unwrap_or_default(),
        labels: args.labels.iter().cloned().collect(),
        stale: args.stale,
        limit: args.limit.unwrap_or(0),
        finished_since_ms: args
            .finished
            .then(|| ago(args.since.unwrap_or(DEFAULT_FINISHED_SINCE))),
        submitted_since_ms: args.since.filter(|_| !args.finished).map(ago),
        fold_arrays: !args.tasks && !args.watch,
        // Finished jobs come in the order they ended, one page at most: the largest.
        page_size: if args.finished { 5_000 } else { 0 },
        after_id: 0,
        newest_first: false,
        before_id: 0,
    }
}

/// Open the watch, list, then print what changes until the stream ends or fails. Changes
/// between the watch's start and the list are printed twice at most, never missed; a watch
/// that says it missed changes is followed by a fresh list.
async fn watch(ctx: &Ctx, req: pb::ListJobsRequest) -> Result<Answer, Failure> {
    let watch_req = req.clone();
    let mut changes = ctx
        .endpoints
        .call(|ch| {
            let r = watch_req.clone();
            async move { Ok(JobServiceClient::new(ch).watch_jobs(r).await?.into_inner()) }
        })
        .await?;
    // The first answer says the watch has begun: from here on nothing is missed.
    changes.message().await.map_err(CallError::Status)?;
    let mut header = true;
    print_jobs(
        ctx,
        &job_pages::list_all(ctx, req.clone()).await?,
        &mut header,
    );
    while let Some(answer) = changes.message().await.map_err(CallError::Status)? {
        if answer.resync {
            print_jobs(
                ctx,
                &job_pages::list_all(ctx, req.clone()).await?,
                &mut header,
            );
        }
        print_jobs(ctx, &answer.jobs, &mut header);
    }
    Ok(Answer::ok(String::new()))
}

/// Rows of the job table (its header only the first time), or one JSON object per line.
fn print_jobs(ctx: &Ctx, jobs: &[pb::Job], header: &mut bool) {
    if jobs.is_empty() {
        return;
    }
    let text: String = match ctx.output {
        Output::Json => jobs.iter().map(|j| format!("{}\n", job_json(j))).collect(),
        Output::Table => {
            let table = jobs_table(jobs, now_ms());
            let skip = usize::from(!std::mem::take(header));
            table.lines().skip(skip).map(|l| format!("{l}\n")).collect()
        }
    };
    output::emit(&text);
}
