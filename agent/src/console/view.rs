//! The pages' frame (head, navigation, who is logged in) and the small pieces every page
//! formats the same way: times, durations, job states.

use std::time::{Duration, UNIX_EPOCH};

use axum::response::{IntoResponse, Response};
use gpu_proto::v1 as pb;
use maud::{Markup, html};

use super::frame;
use super::session::Session;
use crate::api::auth::rbac::Action;

/// The console's sections, in the navigation's order.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Section {
    Cluster,
    Nodes,
    Jobs,
    Submit,
    Tenants,
    Scheduler,
    Alerts,
    Audit,
}

impl Section {
    fn all() -> [Section; 8] {
        use Section::*;
        [
            Cluster, Nodes, Jobs, Submit, Tenants, Scheduler, Alerts, Audit,
        ]
    }

    fn label(self) -> &'static str {
        match self {
            Section::Cluster => "Cluster",
            Section::Nodes => "Nodes & GPUs",
            Section::Jobs => "Jobs",
            Section::Submit => "Submit",
            Section::Tenants => "Tenants",
            Section::Scheduler => "Scheduler",
            Section::Alerts => "Alerts",
            Section::Audit => "Audit",
        }
    }

    fn href(self) -> &'static str {
        match self {
            Section::Cluster => "/console/cluster",
            Section::Nodes => "/console/nodes",
            Section::Jobs => "/console/jobs",
            Section::Submit => "/console/submit",
            Section::Tenants => "/console/tenants",
            Section::Scheduler => "/console/scheduler",
            Section::Alerts => "/console/alerts",
            Section::Audit => "/console/audit",
        }
    }

    /// Whether the session's token would be let in (the link is shown only then).
    fn open_to(self, session: &Session) -> bool {
        match self {
            Section::Submit => session.may_submit(),
            Section::Audit => session.may(Action::ReadAudit),
            _ => true,
        }
    }
}

/// A page of the console, with its navigation and the session's identity.
pub(super) fn page(session: &Session, section: Section, title: &str, body: Markup) -> Response {
    let who = &session.who;
    frame::document(
        &format!("{title} · gpumesh"),
        html! {
                    header.top {
                        a.brand href="/console/jobs" { "gpumesh" }
                        nav {
                            @for s in Section::all() {
                                @if s.open_to(session) {
                                    a href=(s.href()) class=[(s == section).then_some("active")] { (s.label()) }
                                }
                            }
                        }
                        div.who {
                            span #whoami { (who.id) " · " (role_name(who.role)) @if !who.tenant.is_empty() { " · " (who.tenant) } }
                            form method="post" action="/console/logout" {
                                input type="hidden" name="csrf" value=(session.csrf);
                                button.link type="submit" { "Log out" }
                            }
                        }
                    }
                    main { h1 { (title) } (body) }
        },
    )
    .into_response()
}

pub(super) fn role_name(role: i32) -> &'static str {
    match pb::Role::try_from(role) {
        Ok(pb::Role::Admin) => "admin",
        Ok(pb::Role::Operator) => "operator",
        Ok(pb::Role::TenantAdmin) => "tenant admin",
        Ok(pb::Role::User) => "user",
        Ok(pb::Role::Viewer) => "viewer",
        Ok(pb::Role::Node) => "node",
        _ => "unknown",
    }
}

/// A moment as UTC date and time to the second.
pub(super) fn when(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms))
        .to_string()
        .replace('T', " ")
        .replace('Z', "")
}

/// A span of time, shortly: `850ms`, `42s`, `3m12s`, `5h03m`, `2d04h`.
pub(super) fn span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

pub(super) fn state_name(state: i32) -> &'static str {
    match pb::JobState::try_from(state) {
        Ok(pb::JobState::Pending) => "pending",
        Ok(pb::JobState::Bound) => "bound",
        Ok(pb::JobState::Running) => "running",
        Ok(pb::JobState::Succeeded) => "succeeded",
        Ok(pb::JobState::Failed) => "failed",
        Ok(pb::JobState::Cancelled) => "cancelled",
        _ => "unknown",
    }
}

/// A job's state as a coloured badge.
pub(super) fn state_badge(state: i32) -> Markup {
    let name = state_name(state);
    html! { span class={ "state " (name) } { (name) } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_shortly() {
        assert_eq!(span(850), "850ms");
        assert_eq!(span(42_000), "42s");
        assert_eq!(span(192_000), "3m12s");
        assert_eq!(span(5 * 3_600_000 + 180_000), "5h03m");
        assert_eq!(span(2 * 86_400_000 + 4 * 3_600_000), "2d04h");
        assert_eq!(when(0), "1970-01-01 00:00:00");
    }
}
