//! The cluster page: the Raft group's members (role, leader, reachability, how far each has
//! replicated, its build and protocol) and the scheduler's policy and load.

use axum::extract::State;
use gpu_proto::v1 as pb;
use gpu_proto::v1::cluster_service_server::ClusterService;
use gpu_proto::v1::scheduler_service_server::SchedulerService;
use maud::html;

use super::Shared;
use super::failure::Page;
use super::session::Session;
use super::view::{self, Section, span};

pub(super) async fn page(State(apis): State<Shared>, session: Session) -> Page {
    let status = apis
        .cluster
        .get_status(session.request(pb::GetStatusRequest { stale: true }))
        .await?
        .into_inner();
    let scheduler = apis
        .scheduler
        .get_scheduler_status(session.request(pb::GetSchedulerStatusRequest { stale: true }))
        .await?
        .into_inner();
    let policy = scheduler.policy.unwrap_or_default();
    let leader = status
        .leader_id
        .map_or("none".to_owned(), |l| format!("n{l}"));
    let body = html! {
        dl.facts.summary {
            dt { "Leader" } dd #leader { (leader) }
            dt { "Term" } dd { (status.term) }
            dt { "Commit index" } dd { (status.commit_index) }
            dt { "Answered by" } dd { "n" (status.node_id) " (applied " (status.applied_index) ")" }
            dt { "Voters wanted" } dd { (status.voter_target) }
        }
        table.members {
            thead { tr { th { "Node" } th { "Address" } th { "Role" } th { "Reachable" } th { "Last contact" } th { "Replicated to" } th { "Build" } th { "Protocol" } } }
            tbody { @for m in &status.members { tr class=[m.is_leader.then_some("leader")] {
                td { "n" (m.node_id) @if m.is_leader { " " span.tag { "leader" } } }
                td { (m.addr) }
                td { @if m.role == pb::MemberRole::Voter as i32 { "voter" } @else { "learner" } }
                td { @match m.reachable { Some(true) => span.ok { "yes" }, Some(false) => span.bad { "no" }, None => "—" } }
                td { @if let Some(ms) = m.last_contact_ms_ago { (span(ms)) " ago" } }
                td { @if let Some(i) = m.matched_index { (i) } }
                td { (m.build.clone().unwrap_or_default()) }
                td { @if let Some(p) = m.protocol { (p) } }
            } } }
        }
        h2 { "Scheduler" }
        dl.facts {
            dt { "Policy" } dd #policy { (policy.spec) }
            dt { "Ordering" } dd { (policy.ordering) }
            dt { "Backfill" } dd { (policy.backfill) }
            dt { "Preemption" } dd { (policy.preemption) }
            dt { "Jobs" } dd { (scheduler.pending_jobs) " pending, " (scheduler.running_jobs) " running" }
            dt { "GPUs" } dd { (scheduler.gpus_free) " free of " (scheduler.gpus_total) }
        }
    };
    Ok(view::page(&session, Section::Cluster, "Cluster", body))
}
