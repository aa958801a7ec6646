//! Where one write's time goes, stage by stage: a 3-member mesh whose agents stamp every stage
//! a write passes (`gpu_raft_store::write_trace`), and one client at the leader that submits
//! one job at a time and stamps its own send and reply with the same wall clock.
//!
//! A write is matched to its log index by the leader's one `write-out` stamp inside the
//! client's send..reply window; the stamps made before the write has an index (`write-in`,
//! `proposed`) are the leader's first of their kind in that window. The replicating follower
//! is the one that answered first, as a commit needs only it. Each step is the time between
//! two stamps; along the write's critical path the steps add up to the client's round trip:
//! the leader's own fsync and the replication round trip run side by side, and the commit
//! waits for the later of the two.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use gpu_proto::v1::job_service_client::JobServiceClient;
use gpu_raft_store::write_trace::{Stage, Stamp, now_nanos};
use serde::Serialize;

use crate::mesh::{Mesh, submission};
use crate::stats::percentile;
use crate::target::Crashable;

/// Writes before the measured ones (connections, caches).
const WARM_UP: usize = 20;
/// How long after the last write the agents have surely written their stamps out (they write
/// every 50 ms).
const SETTLE: Duration = Duration::from_millis(300);
/// The run number of this benchmark's sequence numbers.
const STAGES_RUN: u64 = 0x5746;

/// One step of a write: between two stamps.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub name: &'static str,
    /// Whether it lies on the critical path of every write (otherwise it is one of two
    /// branches run side by side).
    pub critical: bool,
    pub p50_ms: f64,
    pub p90_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Stages {
    /// Writes timed, and those matched to their stamps.
    pub writes: usize,
    pub matched: usize,
    pub steps: Vec<Step>,
    /// The client's round trip of the matched writes.
    pub round_trip: Step,
    /// The share of matched writes whose AppendEntries left before the leader's fsync ended.
    pub sent_before_flushed: f64,
}

/// Time `writes` submissions, one at a time, at the leader of a traced 3-member mesh.
pub async fn measure(writes: usize) -> anyhow::Result<Stages> {
    let dir = tempfile::tempdir()?;
    let mesh = Mesh::start_traced(3, dir.path()).await;
    let leader = mesh.leader().await? as u64 + 1;
    let mut client = JobServiceClient::new(mesh.cluster.channel(leader).await?);
    let mut windows = Vec::with_capacity(writes);
    for seq in 0..WARM_UP + writes {
        let sent = now_nanos();
        client
            .submit_job(submission((STAGES_RUN << 48) | seq as u64))
            .await
            .context("submitting")?;
        if seq >= WARM_UP {
            windows.push((sent, now_nanos()));
        }
    }
    tokio::time::sleep(SETTLE).await;
    let leader_pid = mesh.cluster.pid(leader).context("the leader is running")?;
    let (on_leader, on_followers) = read_stamps(dir.path(), leader_pid)?;
    let traced: Vec<Trace> = windows
        .iter()
        .filter_map(|&w| Trace::of(w, &on_leader, &on_followers))
        .collect();
    Ok(summarise(writes, &traced))
}

/// A member's stamps by stage, in time order.
type ByStage = HashMap<Stage, Vec<Stamp>>;

/// The leader's stamps, and each follower's.
fn read_stamps(dir: &Path, leader_pid: u32) -> anyhow::Result<(ByStage, Vec<ByStage>)> {
    let mut leader = None;
    let mut followers = Vec::new();
    for file in std::fs::read_dir(dir)? {
        let path = file?.path();
        let pid: u32 = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("{} is no agent's stamps", path.display()))?;
        let mut by_stage = ByStage::new();
        for line in std::fs::read_to_string(&path)?.lines() {
            let stamp = Stamp::parse(line).map_err(anyhow::Error::msg)?;
            by_stage.entry(stamp.stage).or_default().push(stamp);
        }
        for stamps in by_stage.values_mut() {
            stamps.sort_by_key(|s| s.nanos);
        }
        if pid == leader_pid {
            leader = Some(by_stage);
        } else {
            followers.push(by_stage);
        }
    }
    Ok((leader.context("the leader wrote no stamps")?, followers))
}

/// The first stamp of `stage` for `index` at or after `from` (nanos).
fn first(by: &ByStage, stage: Stage, index: u64, from: u64) -> Option<u64> {
    by.get(&stage)?
        .iter()
        .find(|s| s.index == index && s.nanos >= from)
        .map(|s| s.nanos)
}

/// One write's stamps, in nanos.
struct Trace {
    sent: u64,
    request: u64,
    write_in: u64,
    proposed: u64,
    appended: u64,
    flushed: u64,
    to_follower: u64,
    received: u64,
    f_appended: u64,
    f_flushed: u64,
    replied: u64,
    acked: u64,
    applying: u64,
    applied: u64,
    write_out: u64,
    reply: u64,
}

impl Trace {
    /// The stamps of the write the client sent and had answered in `(sent, reply)`, if every
    /// stage of it is found (and its window holds exactly one write).
    fn of((sent, reply): (u64, u64), leader: &ByStage, followers: &[ByStage]) -> Option<Trace> {
        let inside = |stage: Stage| -> Vec<&Stamp> {
            leader.get(&stage).map_or(Vec::new(), |v| {
                v.iter()
                    .filter(|s| s.nanos >= sent && s.nanos <= reply)
                    .collect()
            })
        };
        let [out] = inside(Stage::WriteOut)[..] else {
            return None;
        };
        let index = out.index;
        let request = inside(Stage::Request).first()?.nanos;
        let write_in = first(leader, Stage::WriteIn, 0, request)?;
        let proposed = first(leader, Stage::Proposed, 0, write_in)?;
        let appended = first(leader, Stage::Appended, index, sent)?;
        // The follower that answered first is the one the commit waited for.
        let (follower, replied) = followers
            .iter()
            .filter_map(|f| Some((f, first(f, Stage::Replied, index, sent)?)))
            .min_by_key(|&(_, replied)| replied)?;
        Some(Trace {
            sent,
            request,
            write_in,
            proposed,
            appended,
            flushed: first(leader, Stage::Flushed, index, sent)?,
            to_follower: first(leader, Stage::Sent, index, sent)?,
            received: first(follower, Stage::Received, index, sent)?,
            f_appended: first(follower, Stage::Appended, index, sent)?,
            f_flushed: first(follower, Stage::Flushed, index, sent)?,
            replied,
            acked: first(leader, Stage::Acked, index, sent)?,
            applying: first(leader, Stage::Applying, index, sent)?,
            applied: first(leader, Stage::Applied, index, sent)?,
            write_out: out.nanos,
            reply,
        })
    }
}

/// The steps, each as (name, on every write's critical path, its time in one trace).
type StepOf = (&'static str, bool, fn(&Trace) -> u64);

const STEPS: [StepOf; 15] = [
    (
        "client → the API has the request (TLS, HTTP/2, decoding)",
        true,
        |t| t.request.saturating_sub(t.sent),
    ),
    (
        "the API's checks (token, spec, quota) → the write path",
        true,
        |t| t.write_in.saturating_sub(t.request),
    ),
    ("write path → proposer hands it to Raft", true, |t| {
        t.proposed.saturating_sub(t.write_in)
    }),
    ("Raft's core → leader's log append", true, |t| {
        t.appended.saturating_sub(t.proposed)
    }),
    ("leader's fsync (beside replication)", false, |t| {
        t.flushed.saturating_sub(t.appended)
    }),
    ("append → AppendEntries sent", false, |t| {
        t.to_follower.saturating_sub(t.appended)
    }),
    ("network → follower has decoded it", false, |t| {
        t.received.saturating_sub(t.to_follower)
    }),
    ("follower's core → its log append", false, |t| {
        t.f_appended.saturating_sub(t.received)
    }),
    ("follower's fsync", false, |t| {
        t.f_flushed.saturating_sub(t.f_appended)
    }),
    ("follower's core → its answer", false, |t| {
        t.replied.saturating_sub(t.f_flushed)
    }),
    ("network → leader has the answer", false, |t| {
        t.acked.saturating_sub(t.replied)
    }),
    (
        "commit → apply starts (the later of fsync and answer)",
        true,
        |t| t.applying.saturating_sub(t.flushed.max(t.acked)),
    ),
    ("apply", true, |t| t.applied.saturating_sub(t.applying)),
    ("applied → write path returns", true, |t| {
        t.write_out.saturating_sub(t.applied)
    }),
    ("write path → client", true, |t| {
        t.reply.saturating_sub(t.write_out)
    }),
];

fn summarise(writes: usize, traced: &[Trace]) -> Stages {
    let step = |name, critical, of: &dyn Fn(&Trace) -> u64| {
        let mut times: Vec<Duration> = traced.iter().map(|t| Duration::from_nanos(of(t))).collect();
        times.sort_unstable();
        let ms = |p| percentile(&times, p).map_or(0.0, |d| d.as_secs_f64() * 1e3);
        Step {
            name,
            critical,
            p50_ms: ms(50.0),
            p90_ms: ms(90.0),
        }
    };
    Stages {
        writes,
        matched: traced.len(),
        steps: STEPS
            .iter()
            .map(|&(name, critical, of)| step(name, critical, &of))
            .collect(),
        round_trip: step("the client's round trip", true, &|t| {
            t.reply.saturating_sub(t.sent)
        }),
        sent_before_flushed: traced.iter().filter(|t| t.to_follower < t.flushed).count() as f64
            / traced.len().max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(stamps: &[(Stage, u64, u64)]) -> ByStage {
        let mut by = ByStage::new();
        for &(stage, index, nanos) in stamps {
            by.entry(stage).or_default().push(Stamp {
                stage,
                index,
                nanos,
            });
        }
        by
    }

    #[test]
    fn a_write_is_matched_by_its_window_and_its_critical_steps_add_up_to_the_round_trip() {
        use Stage::*;
        // One write at index 7, sent at 1,000 and answered at 2,000; an agent's own write at
        // index 6 came just before it. The follower answers (1,500) after the leader's fsync
        // (1,300), so the commit waited for the answer.
        let leader = member(&[
            (Appended, 6, 900),
            (Request, 0, 1_005),
            (WriteIn, 0, 1_010),
            (Proposed, 0, 1_030),
            (Appended, 7, 1_100),
            (Sent, 7, 1_120),
            (Sent, 7, 1_130),
            (Flushed, 7, 1_300),
            (Acked, 7, 1_550),
            (Acked, 7, 1_600),
            (Applying, 7, 1_700),
            (Applied, 7, 1_750),
            (WriteOut, 7, 1_900),
        ]);
        let slow = member(&[
            (Received, 7, 1_250),
            (Appended, 7, 1_300),
            (Flushed, 7, 1_500),
            (Replied, 7, 1_580),
        ]);
        let fast = member(&[
            (Received, 7, 1_200),
            (Appended, 7, 1_260),
            (Flushed, 7, 1_450),
            (Replied, 7, 1_500),
        ]);
        let followers = [slow, fast];
        let trace = Trace::of((1_000, 2_000), &leader, &followers).expect("matched");
        assert_eq!(trace.received, 1_200, "the follower that answered first");
        let times: Vec<u64> = STEPS.iter().map(|(_, _, of)| of(&trace)).collect();
        let critical: u64 = STEPS
            .iter()
            .zip(&times)
            .filter(|((_, critical, _), _)| *critical)
            .map(|(_, t)| t)
            .sum();
        let replication: u64 = times[5..11].iter().sum();
        assert_eq!(replication, 1_550 - 1_100);
        assert_eq!(critical + replication, 2_000 - 1_000);
        // No write-out in a window: nothing to match.
        assert!(Trace::of((2_000, 3_000), &leader, &followers).is_none());
    }
}
