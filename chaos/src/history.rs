//! The history: every client operation (and every fault) as invoke / ok / fail / info events
//! with monotonic timestamps, kept in memory and appended as JSON lines to a file.
//!
//! `ok`: the operation took effect (or read what it returned). `fail`: it certainly did not take
//! effect. `info`: unknown (a timeout or a lost connection after the request was sent).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Invoke,
    Ok,
    Fail,
    Info,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    /// Submit a job with an idempotency key; `ok` carries the job id.
    Submit,
    /// Read one job's state; `ok` carries the state name in `value`.
    Read,
    /// A fault the nemesis injected (`value` says what; `minority` who is cut off from now).
    Nemesis,
    /// One agent's own view of the leader (`leader`, `term`), sampled by the observer.
    Status,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Who acted: `w3`, `storm-1-2`, `nemesis`.
    pub process: String,
    pub phase: Phase,
    pub op: OpKind,
    /// ns since the recorder started.
    pub time_ns: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<u64>,
    /// The agent the request went to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Read: the job's generation. Status: unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Nemesis: the agents cut off on a minority side from this event on (empty: healed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minority: Option<Vec<u64>>,
    /// Status: the term the agent is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    /// Status: the leader the agent knows for that term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<u64>,
}

impl Event {
    /// An event with only the required fields; fill the rest with struct update syntax.
    pub fn new(process: &str, phase: Phase, op: OpKind) -> Event {
        Event {
            process: process.to_owned(),
            phase,
            op,
            time_ns: 0,
            key: None,
            job_id: None,
            via: None,
            value: None,
            error: None,
            generation: None,
            minority: None,
            term: None,
            leader: None,
        }
    }
}

/// The process name of every fault the nemesis injects.
pub const NEMESIS: &str = "nemesis";

/// Records events in order, stamping each with the time since the recorder started.
pub struct Recorder {
    start: Instant,
    inner: Mutex<(Vec<Event>, File)>,
}

impl Recorder {
    /// A recorder appending to `path` (created or truncated).
    pub fn create(path: &Path) -> anyhow::Result<Recorder> {
        let file = File::create(path)
            .map_err(|e| anyhow::anyhow!("create history {}: {e}", path.display()))?;
        Ok(Recorder {
            start: Instant::now(),
            inner: Mutex::new((Vec::new(), file)),
        })
    }

    /// Stamp and record `event`. A history that cannot be written is a broken run: the error
    /// is returned to the caller.
    pub fn record(&self, mut event: Event) -> anyhow::Result<()> {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        event.time_ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let mut line = serde_json::to_string(&event)?;
        line.push('\n');
        guard.1.write_all(line.as_bytes())?;
        guard.0.push(event);
        Ok(())
    }

    /// A step of the fault injector (process `nemesis`): `what` it did, in words.
    pub fn nemesis(&self, phase: Phase, what: String) -> anyhow::Result<()> {
        self.nemesis_cut(phase, what, None)
    }

    /// A nemesis step that changes the network: with `minority`, the nodes its cut leaves on
    /// a minority side from now on (`Some(vec![])` when a heal leaves nobody there).
    pub fn nemesis_cut(
        &self,
        phase: Phase,
        what: String,
        minority: Option<Vec<u64>>,
    ) -> anyhow::Result<()> {
        self.record(Event {
            value: Some(what),
            minority,
            ..Event::new(NEMESIS, phase, OpKind::Nemesis)
        })
    }

    /// Everything recorded so far, in order.
    pub fn events(&self) -> Vec<Event> {
        let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        guard.0.clone()
    }
}

/// Read a history written by a `Recorder`.
pub fn load(path: &Path) -> anyhow::Result<Vec<Event>> {
    let file =
        File::open(path).map_err(|e| anyhow::anyhow!("open history {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for line in BufReader::new(file).lines() {
        let line = line?;
        if !line.trim().is_empty() {
            out.push(serde_json::from_str(&line)?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_the_file() {
        let dir = std::env::temp_dir().join(format!("gpu-chaos-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("history test io");
        let path = dir.join("history.jsonl");
        let r = Recorder::create(&path).expect("history test io");
        r.record(Event {
            key: Some("k".into()),
            ..Event::new("w0", Phase::Invoke, OpKind::Submit)
        })
        .expect("history test io");
        r.record(Event {
            key: Some("k".into()),
            job_id: Some(7),
            ..Event::new("w0", Phase::Ok, OpKind::Submit)
        })
        .expect("history test io");
        let back = load(&path).expect("history test io");
        assert_eq!(back, r.events());
        assert!(back[0].time_ns <= back[1].time_ns);
        let text = std::fs::read_to_string(&path).expect("history test io");
        assert!(text.contains("\"phase\":\"invoke\""), "{text}");
        std::fs::remove_dir_all(&dir).expect("history test io");
    }
}
