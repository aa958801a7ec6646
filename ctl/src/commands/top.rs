//! `gpuctl top`: a live terminal view of every node's GPUs — utilization and memory bars,
//! temperature, power against its limit, the job on each GPU and its open alerts — refreshed
//! every `--interval`; `q` or Esc quits. `--once` (and any output that is not a terminal)
//! prints one frame as plain text; `-o json` prints the frame's data (`gpu list`'s JSON plus
//! `alert list`'s).

use std::io::IsTerminal;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::alert_service_client::AlertServiceClient;
use gpu_proto::v1::gpu_service_client::GpuServiceClient;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};

use super::{Answer, Ctx, Failure};
use crate::cli::Output;
use crate::output::table;

/// Everything one frame shows.
pub(crate) struct Frame {
    pub gpus: Vec<pb::GpuStatus>,
    pub alerts: Vec<pb::Alert>,
}

const HEADER: [&str; 9] = [
    "NODE", "GPU", "MODEL", "UTIL", "MEMORY", "TEMP", "POWER", "JOB", "ALERTS",
];
const BAR: usize = 10;

pub(crate) async fn run(ctx: &Ctx, interval: Duration, once: bool) -> Result<Answer, Failure> {
    if once || !std::io::stdout().is_terminal() || ctx.output == Output::Json {
        let frame = fetch(ctx).await?;
        return Ok(ctx.answer(
            || {
                serde_json::json!({
                    "gpus": frame.gpus.iter().map(super::gpu_view::status_json).collect::<Vec<_>>(),
                    "alerts": frame.alerts.iter().map(super::alert::alert_json).collect::<Vec<_>>(),
                })
            },
            || table(&HEADER, &rows(&frame)),
        ));
    }
    let mut terminal = ratatui::init();
    let result = live(ctx, interval, &mut terminal).await;
    ratatui::restore();
    result.map(|()| Answer::ok(String::new()))
}

async fn live(
    ctx: &Ctx,
    interval: Duration,
    terminal: &mut ratatui::DefaultTerminal,
) -> Result<(), Failure> {
    loop {
        let (frame, error) = match fetch(ctx).await {
            Ok(f) => (f, None),
            Err(e) => (
                Frame {
                    gpus: Vec::new(),
                    alerts: Vec::new(),
                },
                Some(e.to_string()),
            ),
        };
        terminal
            .draw(|f| draw(f, &frame, error.as_deref()))
            .map_err(|e| Failure::Usage(format!("drawing the terminal: {e}")))?;
        let until = std::time::Instant::now() + interval;
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            let ready = event::poll(left.min(Duration::from_millis(200)))
                .map_err(|e| Failure::Usage(format!("reading the terminal: {e}")))?;
            if ready
                && let Ok(Event::Key(key)) = event::read()
                && key.kind == KeyEventKind::Press
                && matches!(key.code, KeyCode::Char('q') | KeyCode::Esc)
            {
                return Ok(());
            }
        }
    }
}

async fn fetch(ctx: &Ctx) -> Result<Frame, Failure> {
    let req = pb::ListGpusRequest { node_id: None };
    let gpus = ctx
        .call(GpuServiceClient::new, req, async |mut c, r| {
            c.list_gpus(r).await
        })
        .await?
        .gpus;
    let req = pb::ListAlertsRequest {
        include_resolved: false,
        stale: true,
    };
    let alerts = ctx
        .call(AlertServiceClient::new, req, async |mut c, r| {
            c.list_alerts(r).await
        })
        .await?
        .alerts;
    Ok(Frame { gpus, alerts })
}

fn draw(f: &mut ratatui::Frame, frame: &Frame, error: Option<&str>) {
    let [title, body] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(f.area());
    let busy = frame
        .gpus
        .iter()
        .filter(|g| g.gpu.as_ref().is_some_and(|g| g.job_id.is_some()))
        .count();
    let status = match error {
        Some(e) => format!("gpumesh top — error: {e}   (q quits)"),
        None => format!(
            "gpumesh top — {} GPUs, {busy} busy, {} open alerts   (q quits)",
            frame.gpus.len(),
            frame.alerts.len()
        ),
    };
    f.render_widget(Paragraph::new(Line::from(status)), title);
    let widths = [
        Constraint::Length(5),
        Constraint::Length(4),
        Constraint::Length(12),
        Constraint::Length(BAR as u16 + 6),
        Constraint::Length(BAR as u16 + 12),
        Constraint::Length(6),
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Min(10),
    ];
    let table = Table::new(rows(frame).into_iter().map(Row::new), widths)
        .header(Row::new(HEADER).style(Style::new().add_modifier(Modifier::BOLD)))
        .block(Block::new());
    f.render_widget(table, body);
}

/// One row per GPU, cells as text (shared by the live view and `--once`).
pub(crate) fn rows(frame: &Frame) -> Vec<Vec<String>> {
    frame
        .gpus
        .iter()
        .map(|s| {
            let g = s.gpu.clone().unwrap_or_default();
            let alerts: Vec<&str> = frame
                .alerts
                .iter()
                .filter(|a| a.node_id == s.node_id && a.gpu_index == g.index)
                .map(|a| a.rule.as_str())
                .collect();
            let (util, memory, temp, power) = match &s.telemetry {
                Some(t) if t.healthy => (
                    format!(
                        "{} {:>3.0}%",
                        bar(f64::from(t.utilization_pct) / 100.0),
                        t.utilization_pct
                    ),
                    format!(
                        "{} {:>4.0}/{}G",
                        bar(t.memory_used_mib as f64 / t.memory_total_mib.max(1) as f64),
                        t.memory_used_mib as f64 / 1024.0,
                        t.memory_total_mib / 1024
                    ),
                    format!("{:.0}°C", t.temperature_c),
                    format!("{:.0}/{:.0}W", t.power_w, t.power_limit_w),
                ),
                Some(_) => ("lost".into(), "-".into(), "-".into(), "-".into()),
                None => ("?".into(), "?".into(), "?".into(), "?".into()),
            };
            vec![
                format!("n{}", s.node_id),
                g.index.to_string(),
                g.model.clone(),
                util,
                memory,
                temp,
                power,
                super::gpu_view::job_cell(&g),
                if alerts.is_empty() {
                    "-".into()
                } else {
                    alerts.join(",")
                },
            ]
        })
        .collect()
}

/// A `BAR`-wide bar for a fraction in [0, 1].
fn bar(fraction: f64) -> String {
    let filled = (fraction.clamp(0.0, 1.0) * BAR as f64).round() as usize;
    format!("{}{}", "█".repeat(filled), "░".repeat(BAR - filled))
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;
    use crate::commands::gpu_view::tests::gpu;

    #[test]
    fn a_frame_as_text() {
        let telemetry = |util: f32, used: u64| pb::GpuTelemetry {
            utilization_pct: util,
            memory_used_mib: used,
            memory_total_mib: 81_920,
            temperature_c: 71.4,
            power_w: 312.0,
            power_limit_w: 400.0,
            healthy: true,
            ..Default::default()
        };
        let frame = Frame {
            gpus: vec![
                pb::GpuStatus {
                    node_id: 1,
                    gpu: Some(gpu(0, Some(42), true)),
                    telemetry: Some(telemetry(95.0, 65_536)),
                },
                pb::GpuStatus {
                    node_id: 1,
                    gpu: Some(gpu(1, None, true)),
                    telemetry: Some(telemetry(0.0, 0)),
                },
                pb::GpuStatus {
                    node_id: 2,
                    gpu: Some(gpu(0, None, false)),
                    telemetry: Some(pb::GpuTelemetry {
                        healthy: false,
                        ..Default::default()
                    }),
                },
                pb::GpuStatus {
                    node_id: 3,
                    gpu: Some(gpu(0, None, true)),
                    telemetry: None,
                },
            ],
            alerts: vec![pb::Alert {
                node_id: 1,
                gpu_index: 0,
                rule: "gpu-overheat".into(),
                ..Default::default()
            }],
        };
        expect![[r#"
            NODE  GPU  MODEL      UTIL             MEMORY               TEMP  POWER     JOB   ALERTS
            n1    0    A100-80GB  ██████████  95%  ████████░░   64/80G  71°C  312/400W  j-42  gpu-overheat
            n1    1    A100-80GB  ░░░░░░░░░░   0%  ░░░░░░░░░░    0/80G  71°C  312/400W  -     -
            n2    0    A100-80GB  lost             -                    -     -         -     -
            n3    0    A100-80GB  ?                ?                    ?     ?         -     -
        "#]]
        .assert_eq(&table(&HEADER, &rows(&frame)));
    }
}
