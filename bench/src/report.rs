//! The benchmark report: every figure side by side with etcd's, as JSON and as Markdown.

use std::fmt::Write;

use serde::Serialize;

use crate::layers::Layers;
use crate::load::LoadResult;
use crate::placement::PlacementLatency;
use crate::stages::Stages;
use crate::state_growth::StateGrowth;
use crate::stats::Summary;

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: String,
    pub quick: bool,
    /// Bytes of one submission, and of one etcd put (key + value).
    pub write_bytes: usize,
    pub fsync: Summary,
    pub writes: Vec<WriteRow>,
    pub placement_idle: PlacementLatency,
    pub placement_loaded: PlacementLatency,
    /// The submissions running beside `placement_loaded`.
    pub placement_load: LoadResult,
    pub failover_gpumesh: Summary,
    pub failover_etcd: Option<Summary>,
    pub state: StateGrowth,
}

#[derive(Debug, Serialize)]
pub struct WriteRow {
    pub gpumesh: LoadResult,
    pub etcd: Option<LoadResult>,
}

/// The replicated-writes table: one row per client count, etcd beside gpumesh where it ran.
pub fn writes_markdown(write_bytes: usize, writes: &[WriteRow]) -> String {
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(
        w,
        "Replicated writes, 3 members, {} B each (gpumesh: job submissions; etcd: puts):\n",
        write_bytes
    );
    let _ = writeln!(
        w,
        "| clients | gpumesh writes/s | etcd writes/s | ratio | gpumesh p50 / p99 / max ms | etcd p50 / p99 / max ms | CPU ms per write (gpumesh, etcd) | errors (gpumesh, etcd) |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|");
    for row in writes {
        let g = &row.gpumesh;
        let (e_rate, e_lat, e_cpu, e_err) = match &row.etcd {
            Some(e) => (
                format!("{:.0}", e.writes_per_s),
                lat(&e.latency),
                format!("{:.2}", e.cpu_ms_per_write),
                e.errors,
            ),
            None => ("–".into(), "–".into(), "–".into(), 0),
        };
        let r = row
            .etcd
            .as_ref()
            .map_or("–".into(), |e| ratio(g.writes_per_s, e.writes_per_s));
        let _ = writeln!(
            w,
            "| {} | {:.0} | {e_rate} | {r} | {} | {e_lat} | {:.2}, {e_cpu} | {}, {e_err} |",
            g.clients,
            g.writes_per_s,
            lat(&g.latency),
            g.cpu_ms_per_write,
            g.errors
        );
    }
    let _ = writeln!(
        w,
        "\ngpumesh's CPU ms per write by thread (all three agents, largest first, those under \
         0.001 left out):\n"
    );
    for row in writes {
        let mut groups: Vec<(&String, &f64)> =
            row.gpumesh.cpu_ms_per_write_by_thread.iter().collect();
        groups.sort_by(|a, b| b.1.total_cmp(a.1));
        let groups: Vec<String> = groups
            .into_iter()
            .filter(|(_, ms)| **ms >= 0.001)
            .map(|(name, ms)| format!("{name} {ms:.3}"))
            .collect();
        let _ = writeln!(
            w,
            "- {} clients: {}",
            row.gpumesh.clients,
            groups.join(", ")
        );
    }
    md
}

/// The layers table: each layer's p50 with one client at the leader, and what it adds to the
/// layer before it.
pub fn layers_markdown(layers: &Layers) -> String {
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(
        w,
        "The disk, {} rounds, p50 / p99 ms: a 4 KiB append and fdatasync {}; a {}-byte sled insert and flush {}.\n",
        layers.fdatasync.count,
        fine(&layers.fdatasync),
        crate::layers::ENTRY_BYTES,
        fine(&layers.sled_flush),
    );
    let _ = writeln!(
        w,
        "One client at the leader, p50 ms (what the layer adds to the one above it):\n"
    );
    let _ = writeln!(
        w,
        "| layer | gpumesh | etcd, plain HTTP | etcd, mutual TLS | gpumesh ÷ etcd (TLS) |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|");
    let p50 = |r: Option<&LoadResult>| r.map(|r| r.latency.p50_ms);
    let cell = |now: Option<f64>, before: Option<f64>| match (now, before) {
        (Some(n), Some(b)) => format!("{n:.2} ({:+.2})", n - b),
        (Some(n), None) => format!("{n:.2}"),
        (None, _) => "–".into(),
    };
    let mut before: [Option<f64>; 3] = [None; 3];
    for layer in &layers.layers {
        let now = [
            p50(Some(&layer.gpumesh)),
            p50(layer.etcd_plain.as_ref()),
            p50(layer.etcd_tls.as_ref()),
        ];
        let times = match (now[0], now[2]) {
            (Some(g), Some(e)) if e > 0.0 => format!("{:.2}×", g / e),
            _ => "–".into(),
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {times} |",
            layer.name,
            cell(now[0], before[0]),
            cell(now[1], before[1]),
            cell(now[2], before[2]),
        );
        before = now;
    }
    md
}

/// The stages table: each step's p50 and p90 over the matched writes, those on every write's
/// critical path marked, and the client's round trip.
pub fn stages_markdown(stages: &Stages) -> String {
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(
        w,
        "{} of {} writes matched to their stamps; one client at the leader of 3 members. Steps \
         marked · run beside each other: the commit waits for the later of the leader's fsync \
         and the follower's answer.\n",
        stages.matched, stages.writes
    );
    let _ = writeln!(
        w,
        "AppendEntries left before the leader's fsync ended in {:.0}% of them.\n",
        stages.sent_before_flushed * 100.0
    );
    let _ = writeln!(w, "| step | p50 ms | p90 ms |");
    let _ = writeln!(w, "|---|---|---|");
    for step in stages.steps.iter().chain([&stages.round_trip]) {
        let mark = if step.critical { "" } else { "· " };
        let _ = writeln!(
            w,
            "| {mark}{} | {:.3} | {:.3} |",
            step.name, step.p50_ms, step.p90_ms
        );
    }
    md
}

/// The machine, in one line: CPU model, cores, kernel.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {kernel}")
}

fn ratio(ours: f64, theirs: f64) -> String {
    if theirs > 0.0 {
        format!("{:.2}×", ours / theirs)
    } else {
        "–".into()
    }
}

/// p50 / p99 to the hundredth of a millisecond (the disk's floors are fractions of one).
fn fine(s: &Summary) -> String {
    format!("{:.2} / {:.2}", s.p50_ms, s.p99_ms)
}

fn lat(s: &Summary) -> String {
    format!("{:.1} / {:.1} / {:.1}", s.p50_ms, s.p99_ms, s.max_ms)
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let w = &mut md;
        let _ = writeln!(w, "Machine: {}. Quick run: {}.\n", self.machine, self.quick);
        let _ = writeln!(
            w,
            "Disk fsync floor (4 KiB append + fdatasync, {} rounds): p50 / p99 / max {} ms.\n",
            self.fsync.count,
            lat(&self.fsync)
        );
        w.push_str(&writes_markdown(self.write_bytes, &self.writes));
        let _ = writeln!(
            w,
            "\nSubmit → bound and submit → running, p50 / p99 / max ms ({} jobs each):\n",
            self.placement_idle.jobs
        );
        let _ = writeln!(w, "| mesh | to bound | to running |");
        let _ = writeln!(w, "|---|---|---|");
        for (name, p) in [
            ("idle".to_owned(), &self.placement_idle),
            (
                format!(
                    "under load ({} clients, {:.0} submissions/s)",
                    self.placement_load.clients, self.placement_load.writes_per_s
                ),
                &self.placement_loaded,
            ),
        ] {
            let _ = writeln!(
                w,
                "| {name} | {} | {} |",
                lat(&p.to_bound),
                lat(&p.to_running)
            );
        }
        let _ = writeln!(
            w,
            "\nFailover: kill -9 the leader, time until the next acknowledged write through a surviving member, p50 / p99 / max ms:\n"
        );
        let _ = writeln!(w, "| system | trials | p50 / p99 / max ms |");
        let _ = writeln!(w, "|---|---|---|");
        let _ = writeln!(
            w,
            "| gpumesh | {} | {} |",
            self.failover_gpumesh.count,
            lat(&self.failover_gpumesh)
        );
        if let Some(e) = &self.failover_etcd {
            let _ = writeln!(w, "| etcd | {} | {} |", e.count, lat(e));
        }
        md.push_str(&state_markdown(&self.state));
        md
    }
}

/// A count as people read it on an axis: `1M`, `250k`, `999`.
pub fn thousands(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// The state-growth figures: RSS per agent at each checkpoint, the backup and a restart.
pub fn state_markdown(state: &StateGrowth) -> String {
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(
        w,
        "\nJobs submitted and finished ({:.0} submit-and-cancel pairs/s), resident memory per agent:\n",
        state.pairs_per_s
    );
    let _ = writeln!(w, "| jobs finished | RSS MiB by agent |");
    let _ = writeln!(w, "|---|---|");
    for c in &state.checkpoints {
        let rss: Vec<String> = c.rss_mib.iter().map(|m| format!("{m:.1}")).collect();
        let _ = writeln!(w, "| {} | {} |", c.jobs, rss.join(" / "));
    }
    let _ = writeln!(
        w,
        "\nAt the last: backup (snapshot) {} bytes; a follower restarted and caught up in {:.0} ms.",
        state.snapshot_bytes, state.restart_ms
    );
    md
}

/// MessagePack against JSON (`gpu-bench codec`): each record's bytes and median encode and
/// decode times in both, with MessagePack's share of JSON's.
pub fn codec_table(rows: &[crate::codec::Row]) -> String {
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(
        w,
        "| record | JSON bytes | MessagePack bytes | ratio | JSON encode / decode | \
         MessagePack encode / decode | ratio (encode / decode) |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|");
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
    let time = |d: std::time::Duration| match us(d) {
        t if t >= 10_000.0 => format!("{:.1} ms", t / 1000.0),
        t => format!("{t:.1} µs"),
    };
    for row in rows {
        let (j, p) = (&row.json, &row.packed);
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} / {} | {} / {} | {} / {} |",
            row.what,
            j.bytes,
            p.bytes,
            ratio(p.bytes as f64, j.bytes as f64),
            time(j.encode),
            time(j.decode),
            time(p.encode),
            time(p.decode),
            ratio(us(p.encode), us(j.encode)),
            ratio(us(p.decode), us(j.decode)),
        );
    }
    md
}
