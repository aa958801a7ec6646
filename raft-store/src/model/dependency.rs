//! Job dependencies (`--after ok:j-1,any:j-2`): what a job waits for before it may be placed,
//! and whether the job it names has met, may still meet or can never meet it.
//!
//! A job may only name jobs that exist when it is submitted, so the dependencies form no
//! cycle: every edge points to a smaller id.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::JobId;

/// The most jobs one job may wait for.
pub const MAX_DEPENDENCIES: usize = 64;

/// One job another waits for, and what it must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Dependency {
    pub kind: AfterKind,
    pub job: JobId,
}

/// What the job named by a dependency must do (Slurm's `after`, `afterok`, `afternotok`,
/// `afterany`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterKind {
    /// Start (run), or end without having run.
    Start,
    /// Succeed.
    Ok,
    /// Fail or be cancelled.
    NotOk,
    /// End, however.
    Any,
}

/// How far the job a dependency names has got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Not started (pending or bound).
    NotStarted,
    Running,
    Succeeded,
    /// Failed or cancelled.
    NotOk,
}

/// Where a dependency stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Waiting,
    /// The job it names ended in a way that can never meet it.
    Never,
}

impl Dependency {
    /// Where this dependency stands, given how far the job it names has got.
    pub fn verdict(&self, on: Progress) -> Verdict {
        let ended = matches!(on, Progress::Succeeded | Progress::NotOk);
        match self.kind {
            AfterKind::Start if on != Progress::NotStarted => Verdict::Met,
            AfterKind::Any if ended => Verdict::Met,
            AfterKind::Ok | AfterKind::NotOk if ended => {
                if (on == Progress::Succeeded) == (self.kind == AfterKind::Ok) {
                    Verdict::Met
                } else {
                    Verdict::Never
                }
            }
            _ => Verdict::Waiting,
        }
    }

    /// What it waits for, in words: `j-2 to succeed`.
    pub fn wait_text(&self) -> String {
        let what = match self.kind {
            AfterKind::Start => "to start",
            AfterKind::Ok => "to succeed",
            AfterKind::NotOk => "to fail",
            AfterKind::Any => "to end",
        };
        format!("j-{} {what}", self.job)
    }
}

impl AfterKind {
    fn name(self) -> &'static str {
        match self {
            AfterKind::Start => "start",
            AfterKind::Ok => "ok",
            AfterKind::NotOk => "notok",
            AfterKind::Any => "any",
        }
    }
}

/// `ok:j-2`, as `--after` takes it.
impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:j-{}", self.kind.name(), self.job)
    }
}

impl FromStr for AfterKind {
    type Err = String;

    /// `ok`, `notok`, `any`, `start`, and Slurm's names for them (`afterok`, `after`, …).
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.strip_prefix("after").unwrap_or(s) {
            "ok" => AfterKind::Ok,
            "notok" => AfterKind::NotOk,
            "any" => AfterKind::Any,
            "start" | "" => AfterKind::Start,
            _ => {
                return Err(format!(
                    "unknown dependency kind {s:?} (ok, notok, any or start)"
                ));
            }
        })
    }
}

/// `ok:j-2` or `ok:2`; Slurm's `afterok:2:3` names several jobs of one kind.
pub fn parse_dependencies(text: &str) -> Result<Vec<Dependency>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let mut fields = part.split(':');
        let kind: AfterKind = fields.next().unwrap_or_default().parse()?;
        let mut any = false;
        for id in fields {
            let digits = id.strip_prefix("j-").unwrap_or(id);
            let job = digits
                .parse::<JobId>()
                .ok()
                .filter(|&j| j > 0)
                .ok_or_else(|| format!("{part:?}: {id:?} is not a job id"))?;
            out.push(Dependency { kind, job });
            any = true;
        }
        if !any {
            return Err(format!("{part:?} names no job (e.g. ok:j-12)"));
        }
    }
    if out.is_empty() {
        return Err("no dependency given (e.g. ok:j-12,any:j-13)".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_met_or_never_by_how_the_job_ended() {
        use AfterKind::*;
        use Progress::{NotOk as Failed, NotStarted, Running, Succeeded};
        use Verdict::*;
        let cases = [
            (Ok, NotStarted, Waiting),
            (Ok, Running, Waiting),
            (Ok, Succeeded, Met),
            (Ok, Failed, Never),
            (NotOk, Succeeded, Never),
            (NotOk, Failed, Met),
            (Any, Running, Waiting),
            (Any, Failed, Met),
            (Start, NotStarted, Waiting),
            (Start, Running, Met),
            (Start, Failed, Met),
        ];
        for (kind, on, want) in cases {
            let d = Dependency { kind, job: 1 };
            assert_eq!(d.verdict(on), want, "{kind:?} on {on:?}");
        }
    }

    #[test]
    fn parses_ours_and_slurms_spelling() {
        let d = parse_dependencies("ok:j-1,any:2, afternotok:3:4,after:5").expect("parses");
        let text: Vec<String> = d.iter().map(|d| d.to_string()).collect();
        assert_eq!(
            text,
            ["ok:j-1", "any:j-2", "notok:j-3", "notok:j-4", "start:j-5"]
        );
        for bad in ["", "ok", "ok:", "maybe:j-1", "ok:j-x", "ok:0", "ok:-1"] {
            assert!(parse_dependencies(bad).is_err(), "{bad:?} parsed");
        }
    }
}
