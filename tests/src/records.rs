//! The jobs' own records of their runs, shared by the integration tests and the chaos harness:
//! the script a test job runs, the directory it writes to, and parsing what it wrote.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One run of a job as the job itself recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub job_id: u64,
    pub generation: u64,
    pub node: u64,
    pub gpus: Vec<String>,
    /// Wall-clock ns.
    pub start_ns: u128,
    /// `None` when the run never wrote `end`/`term`: treated as still running.
    pub end_ns: Option<u128>,
}

/// `<root>/records`, where job scripts write. Jobs run as an unprivileged user (`nobody` when
/// the agents are root), so the directory is world-writable (sticky, like /tmp) and `root`,
/// which tempfile creates 0700, is opened for passing through (not for listing).
pub fn prepare_dir(root: &Path) -> std::io::Result<PathBuf> {
    let records = root.join("records");
    std::fs::create_dir_all(&records)?;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o711))?;
    std::fs::set_permissions(&records, std::fs::Permissions::from_mode(0o1777))?;
    Ok(records)
}

/// A job script that records in `dir/j-<id>-g<generation>` its start (ns, node, GPU UUIDs),
/// sleeps `sleep` seconds, and records `end` (or `term` if it is stopped).
pub fn script(dir: &Path, sleep: &str) -> String {
    format!(
        "f={dir}/j-$GPUMESH_JOB_ID-g$GPUMESH_GENERATION; \
         trap 'echo term $(date +%s%N) >> $f; exit 143' TERM; \
         echo start $(date +%s%N) $GPUMESH_NODE_ID $CUDA_VISIBLE_DEVICES >> $f; \
         sleep {sleep} & wait; \
         echo end $(date +%s%N) >> $f",
        dir = dir.display()
    )
}

/// The record of one run.
pub fn read(dir: &Path, job_id: u64, generation: u64) -> std::io::Result<RunRecord> {
    let text = std::fs::read_to_string(dir.join(format!("j-{job_id}-g{generation}")))?;
    parse(job_id, generation, &text)
}

/// Every run recorded in `dir`, ordered by job and generation.
pub fn read_all(dir: &Path) -> std::io::Result<Vec<RunRecord>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let (job_id, generation) = parse_name(name)
            .ok_or_else(|| invalid(format!("unexpected record file {}", path.display())))?;
        out.push(parse(job_id, generation, &std::fs::read_to_string(&path)?)?);
    }
    out.sort_by_key(|r| (r.job_id, r.generation));
    Ok(out)
}

fn parse_name(name: &str) -> Option<(u64, u64)> {
    let (id, generation) = name.strip_prefix("j-")?.split_once("-g")?;
    Some((id.parse().ok()?, generation.parse().ok()?))
}

/// Parse one record file's text.
pub fn parse(job_id: u64, generation: u64, text: &str) -> std::io::Result<RunRecord> {
    let bad = |line: &str| {
        invalid(format!(
            "j-{job_id}-g{generation}: unexpected record line {line:?}"
        ))
    };
    let mut run = RunRecord {
        job_id,
        generation,
        node: 0,
        gpus: Vec::new(),
        start_ns: 0,
        end_ns: None,
    };
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["start", t, node, rest @ ..] => {
                run.start_ns = t.parse().map_err(|_| bad(line))?;
                run.node = node.parse().map_err(|_| bad(line))?;
                run.gpus = rest
                    .first()
                    .map(|g| g.split(',').map(str::to_owned).collect())
                    .unwrap_or_default();
            }
            ["end" | "term", t] => run.end_ns = Some(t.parse().map_err(|_| bad(line))?),
            _ => return Err(bad(line)),
        }
    }
    Ok(run)
}

fn invalid(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_record() {
        let r = parse(3, 2, "start 100 2 GPU-a,GPU-b\nterm 250\n").expect("valid record");
        assert_eq!(r.gpus, vec!["GPU-a", "GPU-b"]);
        assert_eq!((r.node, r.start_ns, r.end_ns), (2, 100, Some(250)));
        assert_eq!(parse_name("j-12-g3"), Some((12, 3)));
        assert!(parse(1, 1, "garbage\n").is_err());
        assert!(parse(1, 1, "start x 2\n").is_err());
    }
}
