//! The jobs' own records: the script each job runs, the world-writable directory it writes to,
//! and parsing what it wrote into `RunRecord`s.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::model::RunRecord;

/// `<root>/records`, world-writable and sticky (jobs run as `nobody` when the agents are root);
/// `root` (created 0700 by tempfile) is opened for passing through, not for listing.
pub fn prepare_dir(root: &Path) -> anyhow::Result<PathBuf> {
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

/// Every run recorded in `dir`.
pub fn read_all(dir: &Path) -> anyhow::Result<Vec<RunRecord>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let (job_id, generation) = parse_name(name)
            .ok_or_else(|| anyhow::anyhow!("unexpected record file {}", path.display()))?;
        let text = std::fs::read_to_string(&path)?;
        out.push(parse(job_id, generation, &text)?);
    }
    out.sort_by_key(|r| (r.job_id, r.generation));
    Ok(out)
}

fn parse_name(name: &str) -> Option<(u64, u64)> {
    let (id, generation) = name.strip_prefix("j-")?.split_once("-g")?;
    Some((id.parse().ok()?, generation.parse().ok()?))
}

/// Parse one record file's text.
pub fn parse(job_id: u64, generation: u64, text: &str) -> anyhow::Result<RunRecord> {
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
                run.start_ns = t.parse()?;
                run.node = node.parse()?;
                run.gpus = rest
                    .first()
                    .map(|g| g.split(',').map(str::to_owned).collect())
                    .unwrap_or_default();
            }
            ["end" | "term", t] => run.end_ns = Some(t.parse()?),
            _ => anyhow::bail!("j-{job_id}-g{generation}: unexpected record line {line:?}"),
        }
    }
    Ok(run)
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
    }
}
