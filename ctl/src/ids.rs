//! Object ids as people type them: jobs as `42` or `j-42`, nodes as `3` or `n3` (the forms the
//! tables print).

/// clap parser for a job id.
pub(crate) fn job_id(s: &str) -> Result<u64, String> {
    prefixed_id(s, "j-", "job", "42 or j-42")
}

/// A job as people name it: `42`, `j-42`, or the task of index 3 of array j-7, `j-7[3]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct JobRef {
    pub id: u64,
    pub task: Option<u32>,
}

/// clap parser for a job or an array task.
pub(crate) fn job_ref(s: &str) -> Result<JobRef, String> {
    let Some((id, rest)) = s.split_once('[') else {
        return job_id(s).map(|id| JobRef { id, task: None });
    };
    let hint = || "expected a job id like 42 or j-42, or an array task like j-7[3]".to_owned();
    let index = rest.strip_suffix(']').ok_or_else(hint)?;
    let task = prefixed_id(index, "", "task", "3").map_err(|_| hint())?;
    let task = u32::try_from(task).map_err(|_| "task index is too large".to_owned())?;
    let id = job_id(id).map_err(|_| hint())?;
    Ok(JobRef {
        id,
        task: Some(task),
    })
}

/// clap parser for a node id.
pub(crate) fn node_id(s: &str) -> Result<u64, String> {
    prefixed_id(s, "n", "node", "3 or n3")
}

/// clap parser for one GPU of one node: `NODE/GPU`, e.g. `2/0` or `n2/0`.
pub(crate) fn gpu_ref(s: &str) -> Result<(u64, u32), String> {
    const HINT: &str = "expected NODE/GPU like 2/0 or n2/0";
    let (node, gpu) = s.split_once('/').ok_or(HINT)?;
    let node = node_id(node).map_err(|_| HINT.to_owned())?;
    let gpu = prefixed_id(gpu, "", "GPU", "0").map_err(|_| HINT.to_owned())?;
    let gpu = u32::try_from(gpu).map_err(|_| "GPU index is too large".to_owned())?;
    Ok((node, gpu))
}

/// Digits only, after an optional case-insensitive prefix: no sign, no spaces.
fn prefixed_id(s: &str, prefix: &str, what: &str, example: &str) -> Result<u64, String> {
    let digits = match s.get(..prefix.len()) {
        Some(p) if p.eq_ignore_ascii_case(prefix) => &s[prefix.len()..],
        _ => s,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("expected a {what} id like {example}"));
    }
    digits
        .parse()
        .map_err(|_| format!("{what} id is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_refs() {
        let r = |id, task| Ok(JobRef { id, task });
        assert_eq!(job_ref("42"), r(42, None));
        assert_eq!(job_ref("j-7[3]"), r(7, Some(3)));
        assert_eq!(job_ref("7[0]"), r(7, Some(0)));
        for bad in [
            "j-7[",
            "j-7[]",
            "j-7[x]",
            "j-7[-1]",
            "j-7[3]x",
            "[3]",
            "j-7[4294967296]",
        ] {
            assert!(job_ref(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn gpu_refs() {
        assert_eq!(gpu_ref("2/0"), Ok((2, 0)));
        assert_eq!(gpu_ref("n3/7"), Ok((3, 7)));
        for bad in [
            "",
            "2",
            "2/",
            "/0",
            "2/-1",
            "2/x",
            "x/0",
            "2/0/1",
            "2/4294967296",
        ] {
            assert!(gpu_ref(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn job_ids() {
        for (input, id) in [("42", 42), ("j-42", 42), ("J-7", 7), ("0", 0), ("j-007", 7)] {
            assert_eq!(job_id(input), Ok(id), "{input}");
        }
        assert_eq!(job_id("18446744073709551615"), Ok(u64::MAX));
        for bad in [
            "",
            "j-",
            "j",
            "-42",
            "+42",
            "j--1",
            "j-+5",
            "j42",
            "n42",
            " 42",
            "42 ",
            "4 2",
            "4.2",
            "j-42x",
            "٤٢",
            "18446744073709551616",
        ] {
            assert!(job_id(bad).is_err(), "{bad:?}");
        }
        assert!(
            job_id("99999999999999999999")
                .expect_err("refused")
                .contains("too large")
        );
    }

    #[test]
    fn node_ids() {
        for (input, id) in [("3", 3), ("n3", 3), ("N12", 12)] {
            assert_eq!(node_id(input), Ok(id), "{input}");
        }
        for bad in ["", "n", "n-3", "-3", "nn3", "node3", "j-3", "3n"] {
            assert!(node_id(bad).is_err(), "{bad:?}");
        }
    }
}
