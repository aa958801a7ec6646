//! The run's timeline chart: a pure function from a history to a hand-written SVG with time on
//! the x axis, a shaded band per nemesis fault (from its injection to its heal), a marker at
//! every leader change the observer saw, and a polyline of acknowledged submissions per second.

use std::fmt::Write;

use crate::history::{Event, OpKind, Phase};

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 320.0;
const LEFT: f64 = 50.0;
const RIGHT: f64 = 940.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 280.0;
const NS: f64 = 1e9;

/// How a nemesis event's `value` starts when it ends the fault before it.
const ENDS_FAULT: [&str; 3] = ["restarted", "SIGCONT", "heal"];

/// A fault from its injection to its heal (ns since the recorder started).
#[derive(Debug, PartialEq, Eq)]
pub struct Fault {
    /// When the nemesis injected it.
    pub start_ns: u64,
    /// When it was healed (or the history ended).
    pub end_ns: u64,
    /// The nemesis's own words: `kill -9 leader n1`.
    pub what: String,
}

/// A leader first seen for a term higher than any seen before.
#[derive(Debug, PartialEq, Eq)]
pub struct LeaderChange {
    /// When an agent first reported it.
    pub time_ns: u64,
    /// The new term.
    pub term: u64,
    /// The leader of that term.
    pub leader: u64,
}

/// The faults: a nemesis `invoke` (other than a heal) up to the next nemesis event that
/// restarts, resumes or heals, or the end of the history.
pub fn faults(history: &[Event]) -> Vec<Fault> {
    let end = end_ns(history);
    let nemesis: Vec<&Event> = history.iter().filter(|e| e.op == OpKind::Nemesis).collect();
    let ends = |e: &Event| {
        let v = e.value.as_deref().unwrap_or("");
        ENDS_FAULT.iter().any(|p| v.starts_with(p))
    };
    nemesis
        .iter()
        .enumerate()
        .filter(|(_, e)| e.phase == Phase::Invoke && !ends(e))
        .map(|(i, e)| Fault {
            start_ns: e.time_ns,
            end_ns: nemesis[i + 1..]
                .iter()
                .find(|h| ends(h))
                .map_or(end, |h| h.time_ns),
            what: e.value.clone().unwrap_or_default(),
        })
        .collect()
}

/// Leader changes from the observer's `status` samples, in time order.
pub fn leader_changes(history: &[Event]) -> Vec<LeaderChange> {
    let mut out: Vec<LeaderChange> = Vec::new();
    for e in history.iter().filter(|e| e.op == OpKind::Status) {
        let (Some(term), Some(leader)) = (e.term, e.leader) else {
            continue;
        };
        if out.last().is_none_or(|last| term > last.term) {
            out.push(LeaderChange {
                time_ns: e.time_ns,
                term,
                leader,
            });
        }
    }
    out
}

/// Acknowledged submissions in each whole second from 0 to the end of the history.
pub fn acks_per_second(history: &[Event]) -> Vec<u64> {
    let mut buckets = vec![0u64; (end_ns(history) / 1_000_000_000) as usize + 1];
    for e in history
        .iter()
        .filter(|e| e.op == OpKind::Submit && e.phase == Phase::Ok)
    {
        buckets[(e.time_ns / 1_000_000_000) as usize] += 1;
    }
    buckets
}

fn end_ns(history: &[Event]) -> u64 {
    history.iter().map(|e| e.time_ns).max().unwrap_or(0)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The timeline chart of `history` as a standalone SVG document.
pub fn svg(history: &[Event]) -> String {
    let span_s = (end_ns(history) as f64 / NS).max(1.0);
    let x = |ns: u64| LEFT + (ns as f64 / NS) / span_s * (RIGHT - LEFT);
    let acks = acks_per_second(history);
    let peak = acks.iter().copied().max().unwrap_or(0).max(1) as f64;
    let y = |n: u64| BOTTOM - n as f64 / peak * (BOTTOM - TOP);

    let mut s = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-size="13">faults (red), leader changes (blue), acknowledged submissions per second (black, peak {peak})</text>"#
    );
    for f in faults(history) {
        let (a, b) = (x(f.start_ns), x(f.end_ns));
        let _ = writeln!(
            s,
            r##"<rect class="fault" x="{a:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#e33" fill-opacity="0.25"><title>{}</title></rect>"##,
            (b - a).max(1.0),
            BOTTOM - TOP,
            escape(&f.what)
        );
    }
    for c in leader_changes(history) {
        let at = x(c.time_ns);
        let _ = writeln!(
            s,
            r##"<line class="leader" x1="{at:.1}" y1="{TOP}" x2="{at:.1}" y2="{BOTTOM}" stroke="#36c" stroke-dasharray="4 3"><title>term {} leader n{}</title></line>"##,
            c.term, c.leader
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" fill="#36c">n{}</text>"##,
            at + 2.0,
            TOP + 10.0,
            c.leader
        );
    }
    let points: Vec<String> = acks
        .iter()
        .enumerate()
        .map(|(sec, n)| format!("{:.1},{:.1}", x(sec as u64 * 1_000_000_000), y(*n)))
        .collect();
    let _ = writeln!(
        s,
        r#"<polyline class="acks" fill="none" stroke="black" stroke-width="1.5" points="{}"/>"#,
        points.join(" ")
    );
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT}" y1="{BOTTOM}" x2="{RIGHT}" y2="{BOTTOM}" stroke="gray"/>"#
    );
    let step = (span_s / 10.0).ceil().max(1.0) as u64;
    for sec in (0..=span_s as u64).step_by(step as usize) {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{sec}s</text>"#,
            x(sec * 1_000_000_000),
            BOTTOM + 15.0
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(time_ns: u64, e: Event) -> Event {
        Event { time_ns, ..e }
    }

    fn nemesis(time_ns: u64, phase: Phase, what: &str) -> Event {
        at(
            time_ns,
            Event {
                value: Some(what.into()),
                ..Event::new("nemesis", phase, OpKind::Nemesis)
            },
        )
    }

    fn status(time_ns: u64, term: u64, leader: Option<u64>) -> Event {
        at(
            time_ns,
            Event {
                term: Some(term),
                leader,
                ..Event::new("observer", Phase::Ok, OpKind::Status)
            },
        )
    }

    fn ack(time_ns: u64) -> Event {
        at(time_ns, Event::new("w0", Phase::Ok, OpKind::Submit))
    }

    const S: u64 = 1_000_000_000;

    fn history() -> Vec<Event> {
        vec![
            status(0, 1, Some(1)),
            ack(S / 2),
            ack(S / 2 + 1),
            nemesis(S, Phase::Invoke, "kill -9 leader n1 <&>"),
            nemesis(S + 5, Phase::Info, "killed n1"),
            status(S + 10, 1, Some(1)),
            status(S + 20, 2, None),
            status(2 * S, 2, Some(2)),
            nemesis(2 * S + 1, Phase::Info, "restarted n1"),
            ack(2 * S + 2),
            nemesis(3 * S, Phase::Invoke, "SIGSTOP leader n2 for 3s"),
            status(3 * S + 1, 3, Some(3)),
            status(3 * S + 2, 3, Some(3)),
            ack(3 * S + S / 2),
        ]
    }

    #[test]
    fn finds_faults_leaders_and_throughput() {
        let h = history();
        let f = faults(&h);
        assert_eq!(
            f.iter().map(|f| (f.start_ns, f.end_ns)).collect::<Vec<_>>(),
            [(S, 2 * S + 1), (3 * S, 3 * S + S / 2)]
        );
        let l = leader_changes(&h);
        assert_eq!(
            l.iter().map(|c| (c.term, c.leader)).collect::<Vec<_>>(),
            [(1, 1), (2, 2), (3, 3)]
        );
        assert_eq!(acks_per_second(&h), [2, 0, 1, 1]);
    }

    #[test]
    fn the_svg_holds_bands_markers_and_the_series() {
        let svg = svg(&history());
        assert!(
            svg.starts_with("<svg ") && svg.ends_with("</svg>\n"),
            "{svg}"
        );
        assert_eq!(svg.matches(r#"<rect class="fault""#).count(), 2, "{svg}");
        assert_eq!(svg.matches(r#"<line class="leader""#).count(), 3, "{svg}");
        assert!(svg.contains("kill -9 leader n1 &lt;&amp;&gt;"), "{svg}");
        let polyline = svg
            .lines()
            .find(|l| l.starts_with(r#"<polyline class="acks""#))
            .expect("a throughput polyline");
        let points = polyline
            .split("points=\"")
            .nth(1)
            .and_then(|p| p.split('"').next())
            .expect("points");
        assert_eq!(points.split(' ').count(), 4, "{polyline}");
    }

    #[test]
    fn an_empty_history_still_draws() {
        let svg = svg(&[]);
        assert_eq!(svg.matches("class=\"fault\"").count(), 0);
        assert!(svg.contains("<polyline"), "{svg}");
    }
}
