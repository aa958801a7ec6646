//! Workload traces: the Philly CSV (`timestamp,duration,num_gpus,gpu_time,cluster`) and a
//! generic CSV, both read by header name. Bad rows are reported with their line number.
//!
//! Generic format (a header line, then one job per line; plain commas, no quoting):
//! `submit,duration,gpus[,tenant][,name][,priority][,estimate][,gpu_type][,nodes][,gpu_fraction][,mig]`
//! in any column order, where
//! `submit` is seconds since the trace start (or `timestamp` as `YYYY-MM-DD HH:MM:SS` UTC),
//! `duration` and `estimate` are seconds, `gpus` is a whole count (`num_gpus` also accepted)
//! `tenant` (or `cluster`) names the tenant and `gpu_type` the GPU type the job requires (as a
//! cluster's models name them: `V100`, `T4`; empty: any), and `nodes` makes the job a gang of
//! that many nodes (`gpus` in all; empty: a job larger than a node is a gang over as few nodes as
//! hold it evenly). A job of one GPU may take part of it instead (GPU-sharing traces such as
//! Alibaba's PAI): `gpu_fraction` below 1 (e.g. `0.25`) asks for that share of a GPU in shared
//! mode, compute and memory alike, and `mig` for one MIG instance of that profile (`1g.10gb`);
//! the cluster needs GPUs in that mode (`cluster.rs`). Unknown columns (e.g. `gpu_time`) are
//! ignored.

use std::fmt;

/// One job of a trace.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TraceJob {
    /// The trace line it came from (1-based, the header is line 1).
    pub line: usize,
    /// Submission time, milliseconds from the first submission of the trace.
    pub submit_ms: u64,
    pub duration_ms: u64,
    pub gpus: u32,
    pub tenant: String,
    pub name: String,
    pub priority: i32,
    /// The user's runtime estimate, if the trace has one.
    pub estimate_s: Option<u64>,
    /// The GPU type it requires, if any.
    pub gpu_type: Option<String>,
    /// A gang over this many nodes, if the trace says.
    pub nodes: Option<u32>,
    /// Part of one GPU rather than whole GPUs, if the trace says.
    pub slice: Option<TraceSlice>,
}

/// Part of one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TraceSlice {
    /// This percentage (1–99) of a shared GPU's compute, and as much of its memory.
    Share(u32),
    /// One MIG instance of this profile.
    Mig(String),
}

/// A row that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub(crate) struct BadRow {
    pub line: usize,
    pub message: String,
}

/// Why a trace could not be read at all.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TraceError {
    #[error("the trace is empty (no header line)")]
    Empty,
    #[error("the header has no {0} column (expected {1})")]
    MissingColumn(&'static str, &'static str),
    #[error("{count} bad row(s), first: {first} (pass --skip-bad-rows to drop them)")]
    BadRows { count: usize, first: BadRow },
    #[error("the trace has no jobs")]
    NoJobs,
}

/// A parsed trace and the rows that were skipped.
#[derive(Debug)]
pub(crate) struct Trace {
    /// Jobs sorted by submission time (then line).
    pub jobs: Vec<TraceJob>,
    pub skipped: Vec<BadRow>,
}

struct Columns {
    submit: (usize, TimeFormat),
    duration: usize,
    gpus: usize,
    tenant: Option<usize>,
    name: Option<usize>,
    priority: Option<usize>,
    estimate: Option<usize>,
    gpu_type: Option<usize>,
    nodes: Option<usize>,
    gpu_fraction: Option<usize>,
    mig: Option<usize>,
    width: usize,
}

#[derive(Clone, Copy)]
enum TimeFormat {
    Seconds,
    DateTime,
}

/// Largest GPU count one job may ask for.
const MAX_GPUS: u32 = 100_000;
/// Longest duration (and latest relative submission) accepted: ten years.
const MAX_SECONDS: f64 = 10.0 * 365.0 * 86_400.0;

/// Parse a whole trace. Bad rows fail the parse unless `skip_bad_rows`.
pub(crate) fn parse(text: &str, skip_bad_rows: bool) -> Result<Trace, TraceError> {
    let mut lines = text.lines().enumerate();
    let (_, header) = lines
        .by_ref()
        .find(|(_, l)| !l.trim().is_empty())
        .ok_or(TraceError::Empty)?;
    let cols = columns(header)?;
    let mut raw: Vec<(usize, f64, TraceJob)> = Vec::new();
    let mut bad = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        match row(&cols, line, i + 1) {
            Ok((t, job)) => raw.push((i + 1, t, job)),
            Err(message) => bad.push(BadRow {
                line: i + 1,
                message,
            }),
        }
    }
    if let Some(first) = bad.first().cloned()
        && !skip_bad_rows
    {
        return Err(TraceError::BadRows {
            count: bad.len(),
            first,
        });
    }
    let start = raw
        .iter()
        .map(|(_, t, _)| *t)
        .min_by(f64::total_cmp)
        .ok_or(TraceError::NoJobs)?;
    let mut jobs: Vec<TraceJob> = raw
        .into_iter()
        .map(|(_, t, mut job)| {
            job.submit_ms = ((t - start) * 1000.0).round() as u64;
            job
        })
        .collect();
    jobs.sort_by_key(|j| (j.submit_ms, j.line));
    Ok(Trace { jobs, skipped: bad })
}

fn columns(header: &str) -> Result<Columns, TraceError> {
    let names: Vec<String> = header
        .split(',')
        .map(|c| c.trim().trim_start_matches('\u{feff}').to_ascii_lowercase())
        .collect();
    let find = |alts: &[&str]| names.iter().position(|n| alts.contains(&n.as_str()));
    let submit = match (find(&["submit"]), find(&["timestamp"])) {
        (Some(i), _) => (i, TimeFormat::Seconds),
        (None, Some(i)) => (i, TimeFormat::DateTime),
        _ => {
            return Err(TraceError::MissingColumn(
                "submission time",
                "submit (seconds) or timestamp (YYYY-MM-DD HH:MM:SS)",
            ));
        }
    };
    Ok(Columns {
        submit,
        duration: find(&["duration"])
            .ok_or(TraceError::MissingColumn("duration", "duration (seconds)"))?,
        gpus: find(&["gpus", "num_gpus"])
            .ok_or(TraceError::MissingColumn("GPU count", "gpus or num_gpus"))?,
        tenant: find(&["tenant", "cluster"]),
        name: find(&["name"]),
        priority: find(&["priority"]),
        estimate: find(&["estimate"]),
        gpu_type: find(&["gpu_type"]),
        nodes: find(&["nodes"]),
        gpu_fraction: find(&["gpu_fraction"]),
        mig: find(&["mig"]),
        width: names.len(),
    })
}

fn row(cols: &Columns, line: &str, number: usize) -> Result<(f64, TraceJob), String> {
    if line.contains('"') {
        return Err("quoted fields are not supported".into());
    }
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    if fields.len() != cols.width {
        return Err(format!(
            "{} fields, the header has {}",
            fields.len(),
            cols.width
        ));
    }
    let submit = match cols.submit.1 {
        TimeFormat::Seconds => seconds("submit", fields[cols.submit.0])?,
        TimeFormat::DateTime => datetime(fields[cols.submit.0])?,
    };
    let duration = seconds("duration", fields[cols.duration])?;
    let gpus_text = fields[cols.gpus];
    let gpus: u32 = gpus_text
        .parse()
        .map_err(|_| format!("GPU count {gpus_text:?} is not a whole number"))?;
    if gpus > MAX_GPUS {
        return Err(format!("GPU count {gpus} is more than {MAX_GPUS}"));
    }
    let text = |col: Option<usize>| col.map(|c| fields[c].to_owned()).unwrap_or_default();
    let tenant = text(cols.tenant);
    let tenant = if tenant.is_empty() {
        gpu_raft_store::DEFAULT_TENANT.to_owned()
    } else {
        tenant
    };
    let priority = match cols.priority.map(|c| fields[c]) {
        None | Some("") => 0,
        Some(p) => p
            .parse()
            .map_err(|_| format!("priority {p:?} is not an integer"))?,
    };
    let nodes = match cols.nodes.map(|c| fields[c]) {
        None | Some("") => None,
        Some(n) => match n.parse::<u32>() {
            Ok(k) if k >= 1 && gpus.is_multiple_of(k) => Some(k),
            _ => {
                return Err(format!(
                    "nodes {n:?} must be a whole number of at least 1 that divides the GPU count {gpus}"
                ));
            }
        },
    };
    let estimate_s = match cols.estimate.map(|c| fields[c]) {
        None | Some("") => None,
        Some(e) => Some(seconds("estimate", e)?.ceil() as u64),
    };
    let slice = slice(
        cols.gpu_fraction.map(|c| fields[c]),
        cols.mig.map(|c| fields[c]),
    )?;
    if slice.is_some() && (gpus != 1 || nodes.is_some()) {
        return Err(format!(
            "a job on part of a GPU (gpu_fraction or mig) asks for 1 GPU on 1 node, not {gpus}"
        ));
    }
    Ok((
        submit,
        TraceJob {
            line: number,
            submit_ms: 0,
            duration_ms: (duration * 1000.0).round() as u64,
            gpus,
            tenant,
            name: text(cols.name),
            priority,
            estimate_s,
            gpu_type: Some(text(cols.gpu_type)).filter(|t| !t.is_empty()),
            nodes,
            slice,
        },
    ))
}

/// The part of a GPU a row's `gpu_fraction` and `mig` fields ask for (a fraction of 1: the
/// whole GPU, no slice).
fn slice(fraction: Option<&str>, mig: Option<&str>) -> Result<Option<TraceSlice>, String> {
    let fraction = match fraction {
        None | Some("") => None,
        Some(f) => match f.parse::<f64>() {
            Ok(v) if v > 0.0 && v <= 1.0 => Some(v),
            _ => {
                return Err(format!(
                    "gpu_fraction {f:?} must be a number above 0, at most 1"
                ));
            }
        },
    };
    match (fraction, mig.filter(|m| !m.is_empty())) {
        (Some(_), Some(_)) => Err("a job asks for gpu_fraction or mig, not both".into()),
        (None, Some(profile)) => {
            gpu_raft_store::mig::known_profile(profile)?;
            Ok(Some(TraceSlice::Mig(profile.to_owned())))
        }
        (Some(f), None) if f < 1.0 => {
            let share = ((f * 100.0).round() as u32).clamp(1, 99);
            Ok(Some(TraceSlice::Share(share)))
        }
        _ => Ok(None),
    }
}

/// A non-negative, finite number of seconds, at most ten years.
fn seconds(what: &str, text: &str) -> Result<f64, String> {
    let v: f64 = text
        .parse()
        .map_err(|_| format!("{what} {text:?} is not a number"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!(
            "{what} {text:?} must be a non-negative number of seconds"
        ));
    }
    if v > MAX_SECONDS {
        return Err(format!("{what} {text:?} is more than ten years"));
    }
    Ok(v)
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) as seconds since the Unix epoch.
fn datetime(text: &str) -> Result<f64, String> {
    let bad = || format!("timestamp {text:?} is not YYYY-MM-DD HH:MM:SS");
    let (date, time) = text.split_once(' ').ok_or_else(bad)?;
    let d: Vec<i64> = date
        .split('-')
        .map(|p| p.parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let t: Vec<i64> = time
        .split(':')
        .map(|p| p.parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let (&[y, m, day], &[hh, mm, ss]) = (d.as_slice(), t.as_slice()) else {
        return Err(bad());
    };
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return Err(bad());
    }
    if hh < 0 || mm < 0 || ss < 0 || !(1970..=9999).contains(&y) {
        return Err(bad());
    }
    Ok((days_from_civil(y, m, day) * 86_400 + hh * 3600 + mm * 60 + ss) as f64)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} jobs ({} rows skipped)",
            self.jobs.len(),
            self.skipped.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PHILLY: &str = "timestamp,duration,num_gpus,gpu_time,cluster\n\
        2017-10-09 07:01:55,66.0,1,66.0,11cb48\n\
        2017-10-09 06:13:03,2951.0,2,5902.0,6214e9\n";

    #[test]
    fn philly_rows_are_sorted_and_relative_to_the_first_submission() {
        let t = parse(PHILLY, false).expect("parse");
        assert_eq!(t.jobs.len(), 2);
        assert_eq!(t.jobs[0].tenant, "6214e9");
        assert_eq!(t.jobs[0].line, 3);
        assert_eq!(t.jobs[0].submit_ms, 0);
        assert_eq!(t.jobs[0].gpus, 2);
        assert_eq!(t.jobs[1].submit_ms, (48 * 60 + 52) * 1000);
        assert_eq!(t.jobs[1].duration_ms, 66_000);
    }

    #[test]
    fn generic_rows_with_optional_columns() {
        let t = parse(
            "gpus,submit,duration,tenant,name,priority,estimate,gpu_type,nodes\n4,10,60,a,bert,2,90,T4,2\n1,0,5,,,,,,\n",
            false,
        )
        .expect("parse");
        assert_eq!(t.jobs[0].tenant, "default");
        assert_eq!(
            t.jobs[1],
            TraceJob {
                line: 2,
                submit_ms: 10_000,
                duration_ms: 60_000,
                gpus: 4,
                tenant: "a".into(),
                name: "bert".into(),
                priority: 2,
                estimate_s: Some(90),
                gpu_type: Some("T4".into()),
                nodes: Some(2),
                slice: None,
            }
        );
    }

    #[test]
    fn a_job_may_ask_for_a_fraction_or_a_mig_instance_of_one_gpu() {
        let t = parse(
            "submit,duration,gpus,gpu_fraction,mig
0,10,1,0.25,
1,10,1,,1g.10gb
2,10,1,1,
3,10,1,0.001,
",
            false,
        )
        .expect("parse");
        let slices: Vec<Option<TraceSlice>> = t.jobs.iter().map(|j| j.slice.clone()).collect();
        assert_eq!(
            slices,
            [
                Some(TraceSlice::Share(25)),
                Some(TraceSlice::Mig("1g.10gb".into())),
                None,
                Some(TraceSlice::Share(1)),
            ],
            "a fraction of 1 is the whole GPU; the smallest share is 1%"
        );
        for (row, says) in [
            ("0,10,2,0.5,", "1 GPU on 1 node"),
            ("0,10,1,1.5,", "at most 1"),
            ("0,10,1,0,", "above 0"),
            ("0,10,1,x,", "above 0"),
            ("0,10,1,0.5,1g.10gb", "not both"),
            ("0,10,1,,9g.99gb", "unknown MIG profile"),
        ] {
            let text = format!("submit,duration,gpus,gpu_fraction,mig\n{row}\n");
            let Err(TraceError::BadRows { first, .. }) = parse(&text, false) else {
                panic!("{row} must be refused");
            };
            assert!(first.message.contains(says), "{row}: {first}");
        }
    }

    #[test]
    fn a_gang_node_count_must_divide_its_gpus() {
        for bad in ["3", "0", "x", "-2"] {
            let text = format!("submit,duration,gpus,nodes\n0,10,8,{bad}\n");
            let Err(TraceError::BadRows { first, .. }) = parse(&text, false) else {
                panic!("nodes {bad} must be refused");
            };
            assert!(first.message.contains("divides the GPU count 8"), "{first}");
        }
    }

    #[test]
    fn epoch_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(datetime("2017-10-09 07:01:55"), Ok(1_507_532_515.0));
    }

    #[test]
    fn bad_rows_name_their_line() {
        let text = "submit,duration,gpus\n0,10,1\n5,-3,1\n6,nan,1\nx,1,1\n7,1,1.5\n8,1\n9,1,1,1\n\
            2,1,99999999\n3,\"1\",1\n";
        let Err(TraceError::BadRows { count, first }) = parse(text, false) else {
            panic!("bad rows must fail the parse");
        };
        assert_eq!(count, 8);
        assert_eq!(first.line, 3);
        assert!(first.message.contains("duration"), "{first}");
        let t = parse(text, true).expect("skipping");
        assert_eq!(t.jobs.len(), 1);
        let lines: Vec<usize> = t.skipped.iter().map(|b| b.line).collect();
        assert_eq!(lines, vec![3, 4, 5, 6, 7, 8, 9, 10]);
    }

    #[test]
    fn unusable_traces_are_errors() {
        assert!(matches!(parse("", false), Err(TraceError::Empty)));
        assert!(matches!(
            parse("when,duration,gpus\n1,1,1\n", false),
            Err(TraceError::MissingColumn(..))
        ));
        assert!(matches!(
            parse("submit,duration,gpus\n", false),
            Err(TraceError::NoJobs)
        ));
        assert!(matches!(
            parse("timestamp,duration,gpus\n2017-13-01 00:00:00,1,1\n", false),
            Err(TraceError::BadRows { .. })
        ));
    }
}
