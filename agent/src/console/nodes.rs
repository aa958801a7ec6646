//! Nodes and GPUs: every node with its state and labels, and its GPUs as a heatmap of the
//! chosen reading (utilization, temperature or memory), MIG instances drawn inside their GPU,
//! broken and quarantined GPUs marked, each GPU's job linked.

use axum::extract::{Path, Query, State};
use std::collections::BTreeMap;

use gpu_proto::v1 as pb;
use gpu_proto::v1::alert_service_server::AlertService;
use gpu_proto::v1::gpu_service_server::GpuService;
use gpu_proto::v1::node_service_server::NodeService;
use maud::{Markup, html};
use serde::Deserialize;

use super::failure::Page;
use super::session::Session;
use super::view::{self, Section};
use super::{Shared, chart};

/// Which reading colours the heatmap.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum Reading {
    #[default]
    Utilization,
    Temperature,
    Memory,
}

impl Reading {
    fn label(self) -> &'static str {
        match self {
            Reading::Utilization => "utilization",
            Reading::Temperature => "temperature",
            Reading::Memory => "memory",
        }
    }

    /// The reading on a 0..=10 scale (10: busiest, hottest, fullest).
    fn heat(self, t: &pb::GpuTelemetry) -> u32 {
        let fraction = match self {
            Reading::Utilization => f64::from(t.utilization_pct) / 100.0,
            // 30 °C cool, 90 °C at the throttling range.
            Reading::Temperature => (f64::from(t.temperature_c) - 30.0) / 60.0,
            Reading::Memory if t.memory_total_mib > 0 => {
                t.memory_used_mib as f64 / t.memory_total_mib as f64
            }
            Reading::Memory => 0.0,
        };
        (fraction.clamp(0.0, 1.0) * 10.0).round() as u32
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct NodesQuery {
    by: Reading,
}

pub(super) async fn page(
    State(apis): State<Shared>,
    session: Session,
    Query(q): Query<NodesQuery>,
) -> Page {
    let nodes = apis
        .node
        .list_nodes(session.request(pb::ListNodesRequest { stale: true }))
        .await?
        .into_inner()
        .nodes;
    let gpus = apis
        .gpu
        .list_gpus(session.request(pb::ListGpusRequest { node_id: None }))
        .await?
        .into_inner()
        .gpus;
    let open = pb::ListAlertsRequest {
        include_resolved: false,
        stale: true,
    };
    let alerts = apis
        .alert
        .list_alerts(session.request(open))
        .await?
        .into_inner()
        .alerts;
    let mut alerted: Alerted = BTreeMap::new();
    for a in alerts {
        alerted
            .entry((a.node_id, a.gpu_index))
            .or_default()
            .push(a.rule);
    }
    let body = html! {
        p.legend {
            "Colour by: "
            @for r in [Reading::Utilization, Reading::Temperature, Reading::Memory] {
                a href={ "/console/nodes?by=" (r.label()) } class=[(r == q.by).then_some("active")] { (r.label()) } " "
            }
            span.scale { @for h in 0..=10 { span class={ "cell heat-" (h) } {} } }
        }
        div.nodes {
            @for n in &nodes {
                @let mine: Vec<&pb::GpuStatus> = gpus.iter().filter(|g| g.node_id == n.id).collect();
                (node_card(n, &mine, &alerted, q.by))
            }
        }
    };
    Ok(view::page(&session, Section::Nodes, "Nodes & GPUs", body))
}

/// The rules of the open alerts on each GPU (node, index).
type Alerted = BTreeMap<(u64, u32), Vec<String>>;

fn node_card(n: &pb::Node, gpus: &[&pb::GpuStatus], alerted: &Alerted, by: Reading) -> Markup {
    let down = n.status == pb::NodeStatus::Down as i32;
    html! {
        section.node class=[down.then_some("down")] {
            h2 {
                "n" (n.id) " " span.addr { (n.addr) }
                @if down { " " span.tag.bad { "down" } }
                @if n.cordoned { " " span.tag { "cordoned" } }
                @if let Some(e) = &n.edge { " " span.tag { "edge " (e.site) } }
            }
            p.labels { @for (k, v) in &n.labels { span.tag { (k) "=" (v) } " " } }
            div.gpus { @for g in gpus {
                @let index = g.gpu.as_ref().map_or(0, |g| g.index);
                (gpu_cell(g, alerted.get(&(n.id, index)), by))
            } }
        }
    }
}

fn gpu_cell(status: &pb::GpuStatus, alerts: Option<&Vec<String>>, by: Reading) -> Markup {
    let gpu = status.gpu.clone().unwrap_or_default();
    let t = status.telemetry.clone();
    let heat = t.as_ref().map_or(0, |t| by.heat(t));
    let broken = !gpu.healthy || t.as_ref().is_some_and(|t| !t.healthy);
    let quarantined = !gpu.quarantined_by.is_empty();
    let mut class = format!("gpu heat-{heat}");
    if broken {
        class.push_str(" broken");
    }
    if quarantined {
        class.push_str(" quarantined");
    }
    if alerts.is_some() {
        class.push_str(" alerted");
    }
    html! {
        div class=(class) data-gpu={ (status.node_id) "/" (gpu.index) } {
            div.gpu-head { a href={ "/console/gpus/" (status.node_id) "/" (gpu.index) } { "GPU " (gpu.index) } " " span.model { (gpu.model) } }
            @if let Some(t) = &t {
                div.readings {
                    span { (format!("{:.0}", t.utilization_pct)) "%" }
                    span { (format!("{:.0}", t.temperature_c)) "°C" }
                    span { (t.memory_used_mib / 1024) "/" (t.memory_total_mib / 1024) " GiB" }
                    span { (format!("{:.0}", t.power_w)) " W" }
                }
            } @else { div.readings { "no reading" } }
            @if let Some(job) = gpu.job_id { div { a href={ "/console/jobs/" (job) } { "j-" (job) } } }
            @if !gpu.mig_layout.is_empty() {
                div.mig { @for instance in &gpu.mig_layout {
                    @let used = gpu.slices.iter().find(|s| s.ends_with(&format!(" {instance}")));
                    div class={ "slice" @if used.is_some() { " used" } } title=[used] { (instance) }
                } }
            }
            @if !gpu.slices.is_empty() && gpu.mig_layout.is_empty() {
                div.shared { @for s in &gpu.slices { div.slice.used { (s) } } }
            }
            @if let Some(rules) = alerts { div.flag { "alert: " (rules.join(", ")) } }
            @if quarantined { div.flag { "quarantined: " (gpu.quarantined_by) } }
            @if broken { div.flag { (t.as_ref().map(|t| t.error.clone()).unwrap_or_else(|| "unhealthy".into())) } }
        }
    }
}

/// How far back a GPU's page looks (the agent keeps `monitor.retention` of readings).
const HISTORY_MS: u64 = 15 * 60 * 1000;

/// One GPU's page: its readings over the last minutes, from the telemetry its own agent keeps.
pub(super) async fn gpu(
    State(apis): State<Shared>,
    session: Session,
    Path((node, index)): Path<(u64, u32)>,
) -> Page {
    let since_ms = crate::clock::now_ms().saturating_sub(HISTORY_MS);
    let req = pb::GetGpuStatsRequest {
        node_id: node,
        gpu_index: index,
        since_ms,
    };
    let readings = apis
        .gpu
        .get_gpu_stats(session.request(req))
        .await?
        .into_inner()
        .readings;
    let series = |f: fn(&pb::GpuTelemetry) -> f64| -> Vec<(u64, f64)> {
        (readings.iter())
            .filter_map(|r| r.telemetry.as_ref().map(|t| (r.at_ms, f(t))))
            .collect()
    };
    let latest = readings
        .last()
        .and_then(|r| r.telemetry.clone())
        .unwrap_or_default();
    let memory_total = (latest.memory_total_mib as f64 / 1024.0).max(1.0);
    let power_limit = f64::from(latest.power_limit_w).max(1.0);
    let body = html! {
        p { a href="/console/nodes" { "← all nodes" } }
        @if readings.is_empty() { p.empty { "No readings kept for this GPU." } }
        @else {
            div.charts {
                (chart::line("Utilization", "%", &series(|t| f64::from(t.utilization_pct)), 0.0, 100.0))
                (chart::line("Temperature", "°C", &series(|t| f64::from(t.temperature_c)), 20.0, 100.0))
                (chart::line("Memory used", "GiB", &series(|t| t.memory_used_mib as f64 / 1024.0), 0.0, memory_total))
                (chart::line("Power", "W", &series(|t| f64::from(t.power_w)), 0.0, power_limit))
            }
        }
    };
    let title = format!("GPU n{node}/{index}");
    Ok(view::page(&session, Section::Nodes, &title, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_map_to_eleven_shades() {
        let t = pb::GpuTelemetry {
            utilization_pct: 55.0,
            temperature_c: 95.0,
            memory_used_mib: 10_240,
            memory_total_mib: 40_960,
            ..pb::GpuTelemetry::default()
        };
        assert_eq!(Reading::Utilization.heat(&t), 6);
        assert_eq!(Reading::Temperature.heat(&t), 10);
        assert_eq!(Reading::Memory.heat(&t), 3);
        assert_eq!(Reading::Memory.heat(&pb::GpuTelemetry::default()), 0);
    }
}
