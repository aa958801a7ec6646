//! Small clap value parsers that check syntax only: `KEY=VALUE` pairs, non-empty words, GPU
//! faults. What the values mean is the server's to judge.

/// `KEY=VALUE`, split at the first `=`; the value may be empty or contain `=`.
pub(crate) fn key_value(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| "expected KEY=VALUE".to_owned())?;
    if k.is_empty() {
        return Err("expected KEY=VALUE with a non-empty KEY".into());
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// A GPU quota `TYPE=GUARANTEED[:BORROW]` (whole GPUs; borrow 0 when absent), e.g.
/// `A100=4:2`. Negative, fractional or non-numeric figures are refused here.
pub(crate) fn quota(s: &str) -> Result<(String, u32, u32), String> {
    let usage =
        || format!("expected TYPE=GUARANTEED[:BORROW] in whole GPUs, e.g. A100=4:2, got {s:?}");
    let (t, figures) = s.split_once('=').ok_or_else(usage)?;
    if t.is_empty() {
        return Err(usage());
    }
    let (g, b) = figures.split_once(':').unwrap_or((figures, "0"));
    let whole = |x: &str| {
        if x.is_empty() || !x.chars().all(|c| c.is_ascii_digit()) {
            return Err(usage());
        }
        x.parse::<u32>()
            .map_err(|_| format!("{x} GPUs is too many"))
    };
    Ok((t.to_owned(), whole(g)?, whole(b)?))
}

/// A Unix account as typed: `USER` or `USER:GROUP` (names or numeric ids). Only the shape is
/// checked here; the server judges the names (and refuses root) with the rules it applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AccountArg {
    pub user: String,
    pub group: Option<String>,
}

pub(crate) fn account(s: &str) -> Result<AccountArg, String> {
    let (user, group) = match s.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (s, None),
    };
    if user.is_empty() || group.is_some_and(str::is_empty) {
        return Err(format!(
            "expected USER or USER:GROUP (names or numeric ids), got {s:?}"
        ));
    }
    Ok(AccountArg {
        user: user.to_owned(),
        group: group.map(str::to_owned),
    })
}

/// A word that must not be empty (e.g. one item of a comma-separated list).
/// `ID` or `FIRST-LAST`: node ids from 1, in order.
pub(crate) fn node_ids(s: &str) -> Result<(u64, u64), String> {
    let id = |t: &str| {
        t.trim_start_matches('n')
            .parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{t:?} is not a node id (1, 2, … or n1, n2, …)"))
    };
    let (first, last) = match s.split_once('-') {
        Some((a, b)) => (id(a)?, id(b)?),
        None => (id(s)?, id(s)?),
    };
    if first > last {
        return Err(format!("{s}: the first id must not exceed the last"));
    }
    Ok((first, last))
}

pub(crate) fn non_empty(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    Ok(s.to_owned())
}

/// A fault to inject into a simulated GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    Overheat,
    Ecc,
    Lost,
    Clear,
    Xid(u32),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Overheat => f.write_str("overheat"),
            Fault::Ecc => f.write_str("ecc"),
            Fault::Lost => f.write_str("lost"),
            Fault::Clear => f.write_str("clear"),
            Fault::Xid(code) => write!(f, "xid:{code}"),
        }
    }
}

/// clap parser for a fault: `overheat`, `ecc`, `lost`, `clear` or `xid:N` (any case).
pub(crate) fn fault(s: &str) -> Result<Fault, String> {
    const HINT: &str = "expected overheat, ecc, lost, clear or xid:N (e.g. xid:79)";
    let lower = s.to_ascii_lowercase();
    match lower.as_str() {
        "overheat" => Ok(Fault::Overheat),
        "ecc" => Ok(Fault::Ecc),
        "lost" => Ok(Fault::Lost),
        "clear" => Ok(Fault::Clear),
        _ => {
            let code = lower.strip_prefix("xid:").ok_or(HINT)?;
            if code.is_empty() || !code.bytes().all(|b| b.is_ascii_digit()) {
                return Err(HINT.into());
            }
            code.parse()
                .map(Fault::Xid)
                .map_err(|_| "XID code is too large".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas() {
        assert_eq!(quota("A100=4:2"), Ok(("A100".into(), 4, 2)));
        assert_eq!(quota("T4=1"), Ok(("T4".into(), 1, 0)));
        for bad in [
            "A100",
            "=4",
            "A100=",
            "A100=-1",
            "A100=NaN",
            "A100=1.5",
            "A100=4:",
            "A100=4:-2",
            "A100=99999999999",
            "A100=inf",
        ] {
            assert!(quota(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn key_values() {
        let kv = |k: &str, v: &str| Ok((k.to_owned(), v.to_owned()));
        assert_eq!(key_value("zone=a"), kv("zone", "a"));
        assert_eq!(key_value("EMPTY="), kv("EMPTY", ""));
        assert_eq!(key_value("OPTS=a=b,c"), kv("OPTS", "a=b,c"));
        assert_eq!(key_value("sp ace= x "), kv("sp ace", " x "));
        for bad in ["", "zone", "=a", "=", "no-equals-sign"] {
            assert!(key_value(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn node_id_ranges() {
        assert_eq!(node_ids("4"), Ok((4, 4)));
        assert_eq!(node_ids("n4-n8"), Ok((4, 8)));
        for bad in ["0", "8-4", "x", "4-", ""] {
            assert!(node_ids(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn non_empty_words() {
        assert_eq!(non_empty("A100"), Ok("A100".to_owned()));
        assert!(non_empty("").is_err());
    }

    #[test]
    fn faults() {
        for (input, want) in [
            ("overheat", Fault::Overheat),
            ("ECC", Fault::Ecc),
            ("lost", Fault::Lost),
            ("clear", Fault::Clear),
            ("xid:79", Fault::Xid(79)),
            ("XID:0", Fault::Xid(0)),
            ("xid:4294967295", Fault::Xid(u32::MAX)),
        ] {
            assert_eq!(fault(input), Ok(want), "{input}");
        }
        for bad in [
            "",
            "xid",
            "xid:",
            "xid:-1",
            "xid:+1",
            "xid: 79",
            "xid:79x",
            "xid:4294967296",
            "meltdown",
            "overheat ",
        ] {
            assert!(fault(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Fault::Xid(79).to_string(), "xid:79");
        assert_eq!(Fault::Overheat.to_string(), "overheat");
    }
}
