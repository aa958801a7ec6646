//! Object ids as people type them: jobs as `42` or `j-42`, nodes as `3` or `n3` (the forms the
//! tables print).

/// clap parser for a job id.
pub fn job_id(s: &str) -> Result<u64, String> {
    prefixed_id(s, "j-", "job", "42 or j-42")
}

/// clap parser for a node id.
pub fn node_id(s: &str) -> Result<u64, String> {
    prefixed_id(s, "n", "node", "3 or n3")
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
