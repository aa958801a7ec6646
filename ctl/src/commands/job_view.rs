//! How a job looks: the stable JSON object, the `job list` table and the `job get` block.
//! The JSON schema is documented in `job.rs`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use gpu_proto::v1 as pb;
use serde_json::{Value, json};

use super::account;
use crate::cli::{JobStateArg, Output};
use crate::output::{self, fields, table_of, truncate};
use crate::units;

/// Longest reason shown in the list table.
const REASON_WIDTH: usize = 60;

pub(super) fn state(j: &pb::Job) -> pb::JobState {
    pb::JobState::try_from(j.state).unwrap_or(pb::JobState::Unspecified)
}

/// The state as JSON spells it: `pending`, …, `cancelled`, or `unknown`.
pub(super) fn state_name(s: pb::JobState) -> &'static str {
    match s {
        pb::JobState::Pending => "pending",
        pb::JobState::Bound => "bound",
        pb::JobState::Running => "running",
        pb::JobState::Succeeded => "succeeded",
        pb::JobState::Failed => "failed",
        pb::JobState::Cancelled => "cancelled",
        pb::JobState::Unspecified => "unknown",
    }
}

/// The state as tables spell it: `Running`.
pub(super) fn state_title(s: pb::JobState) -> String {
    let name = state_name(s);
    let mut chars = name.chars();
    chars.next().map_or_else(String::new, |c| {
        c.to_ascii_uppercase().to_string() + chars.as_str()
    })
}

pub(super) fn is_terminal(s: pb::JobState) -> bool {
    matches!(
        s,
        pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Cancelled
    )
}

/// A single job for stdout: the JSON object or the key: value block.
pub(super) fn render_one(output: Output, j: &pb::Job) -> String {
    match output {
        Output::Json => output::json(&job_json(j)),
        Output::Table => job_block(j),
    }
}

/// The wire state a `--state` argument names.
pub(super) fn state_of(s: JobStateArg) -> pb::JobState {
    match s {
        JobStateArg::Pending => pb::JobState::Pending,
        JobStateArg::Bound => pb::JobState::Bound,
        JobStateArg::Running => pb::JobState::Running,
        JobStateArg::Succeeded => pb::JobState::Succeeded,
        JobStateArg::Failed => pb::JobState::Failed,
        JobStateArg::Cancelled => pb::JobState::Cancelled,
    }
}

pub(super) fn job_json(j: &pb::Job) -> Value {
    let spec = j.spec.clone().unwrap_or_default();
    let env: BTreeMap<&String, &String> = spec.env.iter().collect();
    let selector: BTreeMap<&String, &String> = spec.node_selector.iter().collect();
    let labels: BTreeMap<&String, &String> = spec.labels.iter().collect();
    let mut spec_part = json!({
        "name": spec.name,
        "tenant": spec.tenant,
        "command": spec.command,
        "env": env,
        "workdir": spec.workdir,
        "gpus": spec.gpus,
        "gpu_types": spec.gpu_types,
        "min_gpu_memory_mib": spec.min_gpu_memory_mib,
        "node_selector": selector,
        "priority": spec.priority.unwrap_or(0),
        "runtime_estimate_s": spec.runtime_estimate_s,
        "wall_time_limit_s": spec.wall_time_limit_s,
        "max_attempts": spec.max_attempts.max(1),
        "cpu_millis": spec.cpu_millis,
        "memory_mib": spec.memory_mib,
        "retry_backoff_s": spec.retry_backoff_s,
        "after": spec.after,
        "singleton": spec.singleton,
        "topology": (!spec.topology.is_empty()).then_some(&spec.topology),
        "array": spec.array,
        "labels": labels,
    });
    let status_part = json!({
        "id": j.id,
        "state": state_name(state(j)),
        "idempotency_key": j.idempotency_key,
        "submitted_at_ms": j.submitted_at_ms,
        "attempts": j.attempts,
        "generation": j.generation,
        "node_id": j.node_id,
        "gang_nodes": j.gang_nodes,
        "nodes": spec.nodes.max(1),
        "bound_gpus": j.gpus,
        "gpu_uuids": j.gpu_uuids,
        "reason": j.reason,
        "outcome": j.outcome,
        "exit_code": j.exit_code,
        "signal": j.signal,
        "bound_at_ms": j.bound_at_ms,
        "started_at_ms": j.started_at_ms,
        "finished_at_ms": j.finished_at_ms,
        "cancel_requested": j.cancel_requested,
        "energy_mj": j.energy_mj,
        "not_before_ms": j.not_before_ms,
        "runs": j.runs.iter().map(run_json).collect::<Vec<_>>(),
        "account": account::json(j.account.as_ref()),
        "phase": j.phase,
        "phase_since_ms": j.phase_since_ms,
        "waiting_for": j.waiting_for,
        "held": j.held,
        "array_id": j.array_id,
        "array_index": j.array_index,
        "array_task_states": j.array_task_states.iter().collect::<BTreeMap<_, _>>(),
        "submitted_by": j.submitted_by,
    });
    if let (Value::Object(all), Value::Object(status)) = (&mut spec_part, status_part) {
        all.extend(status);
    }
    spec_part
}

fn run_json(r: &pb::JobRun) -> Value {
    json!({
        "attempt": r.attempt,
        "generation": r.generation,
        "nodes": r.nodes,
        "bound_at_ms": r.bound_at_ms,
        "started_at_ms": r.started_at_ms,
        "finished_at_ms": r.finished_at_ms,
        "outcome": r.outcome,
        "exit_code": r.exit_code,
        "signal": r.signal,
    })
}

/// `j-42`; a task `j-7[3]`; the line of a folded array `j-7[0-9999%64]`.
fn id_cell(j: &pb::Job, spec: &pb::JobSpec) -> String {
    match (j.array_id, j.array_index) {
        (Some(array), _) if !j.array_task_states.is_empty() => format!("j-{array}[{}]", spec.array),
        (Some(array), Some(index)) => format!("j-{array}[{index}]"),
        _ => format!("j-{}", j.id),
    }
}

/// `Running`, or `Running,cancelling` while a cancel is on its way; a folded array's tasks by
/// state, `running:64,pending:9000`.
fn state_cell(j: &pb::Job) -> String {
    if !j.array_task_states.is_empty() {
        let order = [
            "running",
            "bound",
            "pending",
            "succeeded",
            "failed",
            "cancelled",
        ];
        let counts: Vec<String> = order
            .iter()
            .filter_map(|s| j.array_task_states.get(*s).map(|n| format!("{s}:{n}")))
            .collect();
        return counts.join(",");
    }
    let s = state(j);
    let mut cell = state_title(s);
    if j.cancel_requested && !is_terminal(s) {
        cell.push_str(",cancelling");
    }
    if j.held {
        cell.push_str(",held");
    }
    cell
}

fn tenant(spec: &pb::JobSpec) -> &str {
    if spec.tenant.is_empty() {
        "default"
    } else {
        &spec.tenant
    }
}

fn or_dash(s: &str) -> String {
    if s.is_empty() { "-".into() } else { s.into() }
}

/// ID, NAME, TENANT, STATE, GPUS (requested), NODE, AGE (since submission), REASON.
pub(super) fn jobs_table(jobs: &[pb::Job], now_ms: u64) -> String {
    table_of(
        &[
            "ID", "NAME", "TENANT", "STATE", "GPUS", "NODE", "AGE", "REASON",
        ],
        jobs,
        |j| {
            let spec = j.spec.clone().unwrap_or_default();
            let age = Duration::from_secs(now_ms.saturating_sub(j.submitted_at_ms) / 1000);
            vec![
                id_cell(j, &spec),
                spec.name.clone(),
                tenant(&spec).into(),
                state_cell(j),
                spec.gpus.to_string(),
                j.node_id.map_or_else(|| "-".into(), |n| format!("n{n}")),
                units::format_duration(age),
                // A live run's phase (pulling its image) where there is no reason.
                or_dash(&truncate(
                    if j.reason.is_empty() {
                        &j.phase
                    } else {
                        &j.reason
                    },
                    REASON_WIDTH,
                )),
            ]
        },
    )
}

/// The `job get` view: one `Key: value` line per fact.
pub(super) fn job_block(j: &pb::Job) -> String {
    let spec = j.spec.clone().unwrap_or_default();
    let time = |ms: Option<u64>| ms.map_or_else(|| "-".into(), units::rfc3339);
    let mut state = state_title(state(j));
    if j.cancel_requested {
        state.push_str(" (cancel requested)");
    }
    if j.held {
        state.push_str(" (held)");
    }
    let command: Vec<Cow<'_, str>> = spec.command.iter().map(|a| shell_quote(a)).collect();
    let mut lines: Vec<(&str, String)> = vec![
        ("ID", format!("j-{}", j.id)),
        ("Name", spec.name.clone()),
        ("Tenant", tenant(&spec).into()),
        (
            "Account",
            j.account.as_ref().map_or_else(
                || "- (the node's jobs.run_as)".into(),
                |a| account::text(Some(a)),
            ),
        ),
        ("State", state),
    ];
    if !j.phase.is_empty() {
        let since = j
            .phase_since_ms
            .map_or_else(String::new, |t| format!(" (since {})", units::rfc3339(t)));
        lines.push(("Phase", format!("{}{since}", j.phase)));
    }
    lines.push(("Command", command.join(" ")));
    if !spec.workdir.is_empty() {
        lines.push(("Workdir", spec.workdir.clone()));
    }
    lines.push(("GPUs", requested_gpus(&spec)));
    if let Some(limits) = limits(&spec) {
        lines.push(("Limits", limits));
    }
    if !spec.node_selector.is_empty() {
        let selector: BTreeMap<&String, &String> = spec.node_selector.iter().collect();
        let pairs: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
        lines.push(("Selector", pairs.join(",")));
    }
    if !spec.labels.is_empty() {
        let labels: BTreeMap<&String, &String> = spec.labels.iter().collect();
        let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        lines.push(("Labels", pairs.join(",")));
    }
    lines.extend([
        (
            "Node",
            if j.gang_nodes.is_empty() {
                j.node_id.map_or_else(|| "-".into(), |n| format!("n{n}"))
            } else {
                let nodes: Vec<String> = j.gang_nodes.iter().map(|n| format!("n{n}")).collect();
                format!("gang {} (rank order)", nodes.join(","))
            },
        ),
        ("Bound GPUs", bound_gpus(j)),
        ("Attempts", attempts(j, &spec)),
        ("Priority", spec.priority.unwrap_or(0).to_string()),
        ("Reason", or_dash(&j.reason)),
        ("Outcome", or_dash(&j.outcome)),
        (
            "Submitted",
            match j.submitted_by.as_str() {
                "" => units::rfc3339(j.submitted_at_ms),
                by => format!("{} by {by}", units::rfc3339(j.submitted_at_ms)),
            },
        ),
        ("Bound", time(j.bound_at_ms)),
        ("Started", time(j.started_at_ms)),
        ("Finished", time(j.finished_at_ms)),
        ("GPU energy", units::energy(j.energy_mj)),
    ]);
    if !spec.after.is_empty() {
        lines.push(("After", dependencies(j, &spec)));
    }
    if spec.singleton {
        lines.push((
            "Singleton",
            "yes: one job of its name runs at a time".into(),
        ));
    }
    if let (Some(array), Some(index)) = (j.array_id, j.array_index) {
        let task = format!("j-{array}[{index}] of array j-{array}[{}]", spec.array);
        lines.push(("Array task", task));
    }
    if let Some(t) = j
        .not_before_ms
        .filter(|_| j.state == pb::JobState::Pending as i32)
    {
        lines.push(("Retry at", units::rfc3339(t)));
    }
    let mut out = fields(&lines);
    if !j.runs.is_empty() {
        out.push_str("\nRuns:\n");
        out.push_str(&runs_table(&j.runs));
    }
    out
}

/// `ok:j-1 (met), any:j-2 (waiting)`.
fn dependencies(j: &pb::Job, spec: &pb::JobSpec) -> String {
    let parts: Vec<String> = spec
        .after
        .iter()
        .map(|d| {
            let job = d
                .rsplit_once(":j-")
                .and_then(|(_, id)| id.parse::<u64>().ok());
            let waiting = job.is_some_and(|id| j.waiting_for.contains(&id));
            let pending = j.state == pb::JobState::Pending as i32;
            let status = match (waiting, pending) {
                (true, _) => "waiting",
                (false, true) => "met",
                (false, false) => "settled",
            };
            format!("{d} ({status})")
        })
        .collect();
    parts.join(", ")
}

/// `2/3`, with the retry backoff when failed runs are retried: `2/3 (failed runs retried after
/// 10s, doubling)`.
fn attempts(j: &pb::Job, spec: &pb::JobSpec) -> String {
    let mut text = format!("{}/{}", j.attempts, spec.max_attempts.max(1));
    if let Some(b) = spec.retry_backoff_s.filter(|_| spec.max_attempts > 1) {
        let backoff = units::format_duration(Duration::from_secs(b));
        text.push_str(&format!(" (failed runs retried after {backoff}, doubling)"));
    }
    text
}

/// ATTEMPT, GENERATION, NODES (rank order), STARTED, RAN (start to end, or so far), OUTCOME.
fn runs_table(runs: &[pb::JobRun]) -> String {
    table_of(
        &[
            "ATTEMPT",
            "GENERATION",
            "NODES",
            "STARTED",
            "RAN",
            "OUTCOME",
        ],
        runs,
        |r| {
            let nodes: Vec<String> = r.nodes.iter().map(|n| format!("n{n}")).collect();
            let ran = match (r.started_at_ms, r.finished_at_ms) {
                (Some(s), Some(f)) => {
                    units::format_duration(Duration::from_secs(f.saturating_sub(s) / 1000))
                }
                (Some(_), None) => "running".into(),
                (None, _) => "-".into(),
            };
            vec![
                r.attempt.to_string(),
                r.generation.to_string(),
                nodes.join(","),
                r.started_at_ms.map_or_else(|| "-".into(), units::rfc3339),
                ran,
                or_dash(&r.outcome),
            ]
        },
    )
}

/// `2 (types A100,H100; at least 40 GiB each)`.
fn requested_gpus(spec: &pb::JobSpec) -> String {
    let mut constraints = Vec::new();
    if !spec.gpu_types.is_empty() {
        constraints.push(format!("types {}", spec.gpu_types.join(",")));
    }
    if spec.min_gpu_memory_mib > 0 {
        constraints.push(format!("at least {} MiB each", spec.min_gpu_memory_mib));
    }
    if constraints.is_empty() {
        spec.gpus.to_string()
    } else {
        format!("{} ({})", spec.gpus, constraints.join("; "))
    }
}

/// `1.5 CPUs, 4 GiB memory`; `None` without limits.
fn limits(spec: &pb::JobSpec) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(m) = spec.cpu_millis {
        let cores = format!("{}.{:03}", m / 1000, m % 1000);
        let cores = cores.trim_end_matches('0').trim_end_matches('.');
        parts.push(format!("{cores} CPU{}", if m == 1000 { "" } else { "s" }));
    }
    if let Some(m) = spec.memory_mib {
        parts.push(if m % 1024 == 0 {
            format!("{} GiB memory", m / 1024)
        } else {
            format!("{m} MiB memory")
        });
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// `0 (GPU-a), 1 (GPU-b)`; indexes alone where the UUIDs are unknown.
fn bound_gpus(j: &pb::Job) -> String {
    if j.gpus.is_empty() {
        return "-".into();
    }
    let parts: Vec<String> = j
        .gpus
        .iter()
        .enumerate()
        .map(|(i, index)| match j.gpu_uuids.get(i) {
            Some(uuid) if !uuid.is_empty() => format!("{index} ({uuid})"),
            _ => index.to_string(),
        })
        .collect();
    parts.join(", ")
}

/// An argument as a POSIX shell would need it, for display only (jobs never run in a shell).
pub(super) fn shell_quote(arg: &str) -> Cow<'_, str> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "@%+=:,./_-".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        Cow::Borrowed(arg)
    } else {
        Cow::Owned(format!("'{}'", arg.replace('\'', r"'\''")))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use clap::ValueEnum;
    use expect_test::expect;

    use super::*;

    #[test]
    fn every_state_argument_maps_to_its_wire_state() {
        for arg in JobStateArg::value_variants() {
            let name = arg.to_possible_value().map(|v| v.get_name().to_owned());
            assert_eq!(name.as_deref(), Some(state_name(state_of(*arg))));
        }
    }

    pub(crate) fn running() -> pb::Job {
        pb::Job {
            id: 42,
            spec: Some(pb::JobSpec {
                name: "train".into(),
                tenant: "vision".into(),
                command: vec![
                    "python".into(),
                    "train.py".into(),
                    "--note".into(),
                    "it's a test".into(),
                    String::new(),
                ],
                env: [
                    ("B".to_owned(), "2".to_owned()),
                    ("A".to_owned(), "1".to_owned()),
                ]
                .into_iter()
                .collect(),
                workdir: "/data/run".into(),
                gpus: 2,
                gpu_types: vec!["A100".into(), "H100".into()],
                min_gpu_memory_mib: 40_960,
                node_selector: [("zone".to_owned(), "a".to_owned())].into_iter().collect(),
                priority: Some(-5),
                nodes: 0,
                runtime_estimate_s: Some(5400),
                wall_time_limit_s: None,
                max_attempts: 3,
                cpu_millis: Some(1500),
                memory_mib: Some(4096),
                ..Default::default()
            }),
            state: pb::JobState::Running as i32,
            idempotency_key: "0123abcd".into(),
            submitted_at_ms: 1_700_000_000_000,
            attempts: 1,
            generation: 7,
            node_id: Some(3),
            gpus: vec![0, 1],
            gpu_uuids: vec!["GPU-aaaa".into(), "GPU-bbbb".into()],
            reason: String::new(),
            outcome: String::new(),
            exit_code: None,
            signal: None,
            bound_at_ms: Some(1_700_000_001_000),
            started_at_ms: Some(1_700_000_002_500),
            finished_at_ms: None,
            cancel_requested: true,
            energy_mj: 5_400_000,
            gang_nodes: vec![],
            slice: String::new(),
            runs: vec![],
            not_before_ms: None,
            account: Some(pb::Account {
                user: "alice".into(),
                group: "research".into(),
                groups: vec![],
            }),
            phase: "pulling image nvcr.io/x:1: copying layers (2)".into(),
            phase_since_ms: Some(1_700_000_001_500),
            waiting_for: vec![],
            held: false,
            array_id: None,
            array_index: None,
            array_task_states: Default::default(),
            submitted_by: String::new(),
        }
    }

    pub(crate) fn pending() -> pb::Job {
        pb::Job {
            id: 43,
            spec: Some(pb::JobSpec {
                name: "eval".into(),
                command: vec!["./eval".into()],
                gpus: 8,
                ..Default::default()
            }),
            state: pb::JobState::Pending as i32,
            submitted_at_ms: 1_700_000_090_000,
            reason: format!("no node has 8 free GPUs of type {}", "A100,".repeat(20)),
            ..Default::default()
        }
    }

    pub(crate) fn failed() -> pb::Job {
        pb::Job {
            id: 7,
            spec: Some(pb::JobSpec {
                name: "bad".into(),
                command: vec!["false".into()],
                gpus: 1,
                ..Default::default()
            }),
            state: pb::JobState::Failed as i32,
            submitted_at_ms: 1_699_990_000_000,
            attempts: 1,
            node_id: Some(1),
            gpus: vec![3],
            reason: "exited with code 1\u{1b}[31m".into(),
            outcome: "exited with code 1".into(),
            exit_code: Some(1),
            finished_at_ms: Some(1_699_990_060_000),
            ..Default::default()
        }
    }

    #[test]
    fn states_have_names() {
        assert_eq!(state_title(pb::JobState::Cancelled), "Cancelled");
        assert_eq!(state_name(pb::JobState::Unspecified), "unknown");
        let odd = pb::Job {
            state: 99,
            ..Default::default()
        };
        assert_eq!(state(&odd), pb::JobState::Unspecified);
        assert!(is_terminal(pb::JobState::Failed) && !is_terminal(pb::JobState::Bound));
    }

    #[test]
    fn limits_read_naturally() {
        let spec = |cpu_millis, memory_mib| pb::JobSpec {
            cpu_millis,
            memory_mib,
            ..Default::default()
        };
        assert_eq!(limits(&spec(None, None)), None);
        for (cpu, mem, text) in [
            (Some(1500), None, "1.5 CPUs"),
            (Some(1000), None, "1 CPU"),
            (Some(2000), None, "2 CPUs"),
            (Some(250), None, "0.25 CPUs"),
            (Some(1), None, "0.001 CPUs"),
            (None, Some(4096), "4 GiB memory"),
            (None, Some(1536), "1536 MiB memory"),
            (Some(500), Some(512), "0.5 CPUs, 512 MiB memory"),
        ] {
            assert_eq!(limits(&spec(cpu, mem)).as_deref(), Some(text));
        }
    }

    #[test]
    fn quoting_for_display() {
        assert_eq!(shell_quote("train.py"), "train.py");
        assert_eq!(shell_quote("--lr=0.1"), "--lr=0.1");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
        assert_eq!(shell_quote("日本"), "'日本'");
    }

    #[test]
    fn table_renders() {
        let now = 1_700_000_100_000;
        expect![[r#"
            ID    NAME   TENANT   STATE               GPUS  NODE  AGE    REASON
            j-7   bad    default  Failed              1     n1    2h48m  exited with code 1?[31m
            j-42  train  vision   Running,cancelling  2     n3    1m40s  pulling image nvcr.io/x:1: copying layers (2)
            j-43  eval   default  Pending             8     -     10s    no node has 8 free GPUs of type A100,A100,A100,A100,A100,A1…
        "#]]
        .assert_eq(&jobs_table(&[failed(), running(), pending()], now));
    }

    #[test]
    fn block_renders() {
        expect![[r#"
            ID:          j-42
            Name:        train
            Tenant:      vision
            Account:     alice:research
            State:       Running (cancel requested)
            Phase:       pulling image nvcr.io/x:1: copying layers (2) (since 2023-11-14T22:13:21Z)
            Command:     python train.py --note 'it'\''s a test' ''
            Workdir:     /data/run
            GPUs:        2 (types A100,H100; at least 40960 MiB each)
            Limits:      1.5 CPUs, 4 GiB memory
            Selector:    zone=a
            Node:        n3
            Bound GPUs:  0 (GPU-aaaa), 1 (GPU-bbbb)
            Attempts:    1/3
            Priority:    -5
            Reason:      -
            Outcome:     -
            Submitted:   2023-11-14T22:13:20Z
            Bound:       2023-11-14T22:13:21Z
            Started:     2023-11-14T22:13:22Z
            Finished:    -
            GPU energy:  5.4 kJ
        "#]]
        .assert_eq(&job_block(&running()));
        expect![[r#"
            ID:          j-43
            Name:        eval
            Tenant:      default
            Account:     - (the node's jobs.run_as)
            State:       Pending
            Command:     ./eval
            GPUs:        8
            Node:        -
            Bound GPUs:  -
            Attempts:    0/1
            Priority:    0
            Reason:      no node has 8 free GPUs of type A100,A100,A100,A100,A100,A100,A100,A100,A100,A100,A100,A100,A100,A100,A100,A100,A100,A100,A100,A100,
            Outcome:     -
            Submitted:   2023-11-14T22:14:50Z
            Bound:       -
            Started:     -
            Finished:    -
            GPU energy:  0 J
        "#]]
        .assert_eq(&job_block(&pending()));
    }

    #[test]
    fn runs_render_as_a_table_of_attempts() {
        let run = |attempt, generation, nodes: Vec<u64>, start, end, outcome: &str| pb::JobRun {
            attempt,
            generation,
            nodes,
            bound_at_ms: start,
            started_at_ms: Some(start),
            finished_at_ms: end,
            outcome: outcome.into(),
            ..Default::default()
        };
        let t = 1_700_000_000_000;
        let job = pb::Job {
            state: pb::JobState::Pending as i32,
            spec: Some(pb::JobSpec {
                max_attempts: 3,
                retry_backoff_s: Some(10),
                ..failed().spec.unwrap_or_default()
            }),
            attempts: 2,
            not_before_ms: Some(t + 95_000),
            runs: vec![
                run(1, 1, vec![1, 2], t, Some(t + 5_000), "exited with code 1"),
                run(
                    2,
                    2,
                    vec![2, 1],
                    t + 20_000,
                    Some(t + 75_000),
                    "killed by signal 9",
                ),
            ],
            ..failed()
        };
        let block = job_block(&job);
        let tail = &block[block.find("Attempts").expect("attempts")..];
        expect![[r#"
            Attempts:    2/3 (failed runs retried after 10s, doubling)
            Priority:    0
            Reason:      exited with code 1?[31m
            Outcome:     exited with code 1
            Submitted:   2023-11-14T19:26:40Z
            Bound:       -
            Started:     -
            Finished:    2023-11-14T19:27:40Z
            GPU energy:  0 J
            Retry at:    2023-11-14T22:14:55Z

            Runs:
            ATTEMPT  GENERATION  NODES  STARTED               RAN  OUTCOME
            1        1           n1,n2  2023-11-14T22:13:20Z  5s   exited with code 1
            2        2           n2,n1  2023-11-14T22:13:40Z  55s  killed by signal 9
        "#]]
        .assert_eq(tail);
        let json = job_json(&job);
        assert_eq!(json["runs"][1]["nodes"], json!([2, 1]));
        assert_eq!(json["runs"][0]["outcome"], "exited with code 1");
        assert_eq!(json["retry_backoff_s"], 10);
        assert_eq!(json["not_before_ms"], t + 95_000);
    }

    #[test]
    fn json_renders() {
        expect![[r#"
            {
              "account": {
                "group": "research",
                "groups": [],
                "user": "alice"
              },
              "after": [],
              "array": "",
              "array_id": null,
              "array_index": null,
              "array_task_states": {},
              "attempts": 1,
              "bound_at_ms": 1700000001000,
              "bound_gpus": [
                0,
                1
              ],
              "cancel_requested": true,
              "command": [
                "python",
                "train.py",
                "--note",
                "it's a test",
                ""
              ],
              "cpu_millis": 1500,
              "energy_mj": 5400000,
              "env": {
                "A": "1",
                "B": "2"
              },
              "exit_code": null,
              "finished_at_ms": null,
              "gang_nodes": [],
              "generation": 7,
              "gpu_types": [
                "A100",
                "H100"
              ],
              "gpu_uuids": [
                "GPU-aaaa",
                "GPU-bbbb"
              ],
              "gpus": 2,
              "held": false,
              "id": 42,
              "idempotency_key": "0123abcd",
              "labels": {},
              "max_attempts": 3,
              "memory_mib": 4096,
              "min_gpu_memory_mib": 40960,
              "name": "train",
              "node_id": 3,
              "node_selector": {
                "zone": "a"
              },
              "nodes": 1,
              "not_before_ms": null,
              "outcome": "",
              "phase": "pulling image nvcr.io/x:1: copying layers (2)",
              "phase_since_ms": 1700000001500,
              "priority": -5,
              "reason": "",
              "retry_backoff_s": null,
              "runs": [],
              "runtime_estimate_s": 5400,
              "signal": null,
              "singleton": false,
              "started_at_ms": 1700000002500,
              "state": "running",
              "submitted_at_ms": 1700000000000,
              "submitted_by": "",
              "tenant": "vision",
              "topology": null,
              "waiting_for": [],
              "wall_time_limit_s": null,
              "workdir": "/data/run"
            }
        "#]]
        .assert_eq(&output::json(&job_json(&running())));
        let empty = job_json(&pb::Job::default());
        assert_eq!(empty["state"], "unknown");
        assert_eq!(empty["max_attempts"], 1);
        assert_eq!(empty["node_id"], Value::Null);
    }
}
