//! Job arrays (`--array 0-9999%64`): one submission, one task per index, each task a job of its
//! own with the array's spec. The tasks take consecutive ids in index order, the first of them
//! naming the array (`j-7`, and its task of index 3 `j-7[3]`); at most `max_running` of them hold
//! GPUs at a time.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::JobId;

/// The most tasks one array may have, whatever an agent's configuration allows.
pub const MAX_ARRAY_TASKS: u64 = 100_000;

/// The largest task index.
pub(crate) const MAX_ARRAY_INDEX: u32 = 10_000_000;

/// The indexes an array was submitted with, and its throttle.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArraySpec {
    /// Ascending, not overlapping.
    pub ranges: Vec<IndexRange>,
    /// At most this many tasks hold GPUs at once; none: no limit but the cluster's room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u32>,
}

/// `start-end:step` (inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IndexRange {
    pub start: u32,
    pub end: u32,
    pub step: u32,
}

/// Which array a job is a task of, and its index there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayTask {
    /// The array's id: its first task's job id.
    pub array: JobId,
    pub index: u32,
}

impl IndexRange {
    fn len(&self) -> u64 {
        u64::from((self.end - self.start) / self.step) + 1
    }

    /// Its largest index.
    pub fn last(&self) -> u32 {
        self.end - (self.end - self.start) % self.step
    }
}

impl ArraySpec {
    /// How many tasks it has.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(IndexRange::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Its task indexes, ascending.
    pub fn indexes(&self) -> impl Iterator<Item = u32> + '_ {
        self.ranges
            .iter()
            .flat_map(|r| (r.start..=r.end).step_by(r.step as usize))
    }

    /// The position (0-based) of task `index`, if the array has one.
    pub fn position(&self, index: u32) -> Option<u64> {
        let mut before = 0;
        for r in &self.ranges {
            if (r.start..=r.end).contains(&index) {
                return (index - r.start)
                    .is_multiple_of(r.step)
                    .then(|| before + u64::from((index - r.start) / r.step));
            }
            before += r.len();
        }
        None
    }

    /// Within bounds: ascending ranges that do not overlap, a step of at least 1, at most
    /// `max_tasks` tasks, indexes up to `MAX_ARRAY_INDEX`, a throttle of at least 1.
    pub fn validate(&self, max_tasks: u64) -> Result<(), String> {
        if self.ranges.is_empty() {
            return Err("an array needs at least one index".into());
        }
        let mut after: Option<u32> = None;
        for r in &self.ranges {
            if r.start > r.end {
                return Err(format!("array range {}-{} is reversed", r.start, r.end));
            }
            if r.step == 0 {
                return Err("an array step must be at least 1".into());
            }
            if r.end > MAX_ARRAY_INDEX {
                return Err(format!("array indexes go up to {MAX_ARRAY_INDEX}"));
            }
            if after.is_some_and(|last| r.start <= last) {
                return Err(format!(
                    "array ranges must ascend without overlapping: {} comes after {}",
                    r.start,
                    after.unwrap_or_default()
                ));
            }
            after = Some(r.last());
        }
        let len = self.len();
        if len > max_tasks {
            return Err(format!(
                "an array has at most {max_tasks} tasks, this one {len}"
            ));
        }
        if self.max_running == Some(0) {
            return Err("an array's %limit must be at least 1".into());
        }
        Ok(())
    }
}

/// `0-9999%64`, `1,3,5-9:2`: the form `--array` takes (Slurm's).
impl fmt::Display for ArraySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match (r.start == r.end, r.step) {
                (true, _) => write!(f, "{}", r.start)?,
                (false, 1) => write!(f, "{}-{}", r.start, r.end)?,
                (false, step) => write!(f, "{}-{}:{step}", r.start, r.end)?,
            }
        }
        if let Some(m) = self.max_running {
            write!(f, "%{m}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for ArraySpec {
    type Err = String;

    /// Syntax only (`validate` judges the content): items `N`, `A-B` or `A-B:S`, separated
    /// by commas, then an optional `%LIMIT`.
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |what: &str| format!("--array {text:?}: {what} (e.g. 0-99%8 or 1,3,5-9:2)");
        let (items, limit) = match text.split_once('%') {
            Some((items, limit)) => (items, Some(limit)),
            None => (text, None),
        };
        let number = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| bad(&format!("{s:?} is not an index")))
        };
        let mut ranges = Vec::new();
        for item in items.split(',') {
            let (span, step) = match item.split_once(':') {
                Some((span, step)) => (span, number(step)?),
                None => (item, 1),
            };
            let (start, end) = match span.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None => {
                    let n = number(span)?;
                    (n, n)
                }
            };
            ranges.push(IndexRange { start, end, step });
        }
        let max_running = limit
            .map(|l| {
                l.trim()
                    .parse::<u32>()
                    .map_err(|_| bad("%LIMIT is not a number"))
            })
            .transpose()?;
        Ok(ArraySpec {
            ranges,
            max_running,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ArraySpec, String> {
        let spec: ArraySpec = text.parse()?;
        spec.validate(10_000)?;
        Ok(spec)
    }

    #[test]
    fn parses_counts_and_prints_slurms_forms() {
        let a = parse("0-9999%64").expect("valid");
        assert_eq!((a.len(), a.max_running), (10_000, Some(64)));
        assert_eq!(a.to_string(), "0-9999%64");
        let b = parse("1,3,5-9:2,20").expect("valid");
        assert_eq!(b.indexes().collect::<Vec<_>>(), [1, 3, 5, 7, 9, 20]);
        assert_eq!(b.to_string(), "1,3,5-9:2,20");
        assert_eq!(b.position(7), Some(3));
        assert_eq!(b.position(20), Some(5));
        assert_eq!(b.position(6), None);
        assert_eq!(b.position(0), None);
        let c = parse("0-10:5").expect("valid");
        assert_eq!(c.indexes().collect::<Vec<_>>(), [0, 5, 10]);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn refuses_reversed_huge_overlapping_and_malformed_ranges() {
        for (text, says) in [
            ("9-0", "reversed"),
            ("0-10000", "at most 10000 tasks"),
            ("0-5,3-8", "ascend without overlapping"),
            ("0-8:4,8", "ascend without overlapping"),
            ("5,1", "ascend"),
            ("0-9:0", "step"),
            ("0-9%0", "at least 1"),
            ("", "not an index"),
            ("a-b", "not an index"),
            ("0-9%x", "LIMIT"),
            ("-1-5", "not an index"),
            ("1-2-3", "not an index"),
            ("0-99999999", "indexes go up to"),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
