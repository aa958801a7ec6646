//! Quantities as people type and read them: durations, memory sizes, timestamps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

const DURATION_HINT: &str = "expected a duration like 500ms, 30s, 5m or 2h";

/// An integer followed by `ms`, `s`, `m` or `h` (a small humantime subset). Zero is allowed.
/// Now, in Unix milliseconds (0 before 1970).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(crate) fn parse_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    if n.is_empty() {
        return None;
    }
    let n: u64 = n.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        "h" => Some(Duration::from_secs(n.checked_mul(3600)?)),
        _ => None,
    }
}

/// Energy in millijoules as people read it: `850 J`, `5.4 kJ`, `12.3 MJ` (`3.4 kWh` beyond 100 MJ).
pub(crate) fn energy(mj: u64) -> String {
    let joules = mj as f64 / 1000.0;
    match joules {
        j if j < 1_000.0 => format!("{j:.0} J"),
        j if j < 1_000_000.0 => format!("{:.1} kJ", j / 1_000.0),
        j if j < 100_000_000.0 => format!("{:.1} MJ", j / 1_000_000.0),
        j => format!("{:.1} kWh", j / 3_600_000.0),
    }
}

/// clap parser for a duration that may be zero (`30s`, `2m`); negative ones are refused.
pub(crate) fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).ok_or_else(|| DURATION_HINT.to_owned())
}

/// clap parser for deadlines (`--timeout`): a duration above zero.
pub(crate) fn positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s) {
        Some(d) if d.is_zero() => Err("must be more than zero".into()),
        Some(d) => Ok(d),
        None => Err(DURATION_HINT.into()),
    }
}

/// clap parser for durations the API carries in whole seconds (`--estimate`, `--wall-time`).
/// Sub-second parts are refused rather than rounded; whether zero makes sense is the server's call.
pub(crate) fn whole_seconds(s: &str) -> Result<u64, String> {
    let d = parse_duration(s).ok_or(DURATION_HINT)?;
    if d.subsec_nanos() != 0 {
        return Err("must be a whole number of seconds (e.g. 90s or 2m)".into());
    }
    Ok(d.as_secs())
}

/// clap parser for how far back to look (`--since 7d`): a humantime duration (`12h`, `7d`,
/// `2weeks`).
pub(crate) fn age(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("expected a duration like 12h, 7d or 2weeks: {e}"))
}

/// clap parser for `--time-limit`: a humantime duration (`90m`, `12h`, `2days`, `1h 30m`) in
/// whole seconds. A negative or unparsable value is refused with why; whether zero or a year
/// and more makes sense is the server's call (the rule lives beside the other job rules).
pub(crate) fn time_limit(s: &str) -> Result<u64, String> {
    const HINT: &str = "expected a duration like 90m, 12h, 2days or 1h30m";
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("a time limit cannot be negative, got {s:?}"));
    }
    let d = humantime::parse_duration(t).map_err(|e| format!("{HINT}: {e}"))?;
    if d.subsec_nanos() != 0 {
        return Err("must be a whole number of seconds (e.g. 90s or 2m)".into());
    }
    Ok(d.as_secs())
}

/// clap parser for memory sizes, in MiB: `40GiB`, `80G`, `40960MiB`, `1TiB`; a plain number is
/// MiB. Units are binary (G means GiB), as in nvidia-smi and Slurm's `--mem`; MB/GB/TB are
/// refused because they are read both ways.
pub(crate) fn size_mib(s: &str) -> Result<u64, String> {
    const HINT: &str = "expected a size like 40GiB, 80G or 40960MiB (a plain number is MiB)";
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    if n.is_empty() {
        return Err(HINT.into());
    }
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "m" | "mi" | "mib" => 1,
        "g" | "gi" | "gib" => 1024,
        "t" | "ti" | "tib" => 1024 * 1024,
        "mb" | "gb" | "tb" => {
            return Err(
                "MB/GB/TB are ambiguous; use MiB, GiB or TiB (M, G, T mean the same)".into(),
            );
        }
        _ => return Err(HINT.into()),
    };
    n.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| "size is too large".into())
}

/// MiB as whole GiB, rounded half up: `81920` → `80 GiB`.
pub(crate) fn gib(mib: u64) -> String {
    let whole = mib / 1024 + u64::from(mib % 1024 >= 512);
    format!("{whole} GiB")
}

/// A compact duration: `0s`, `750ms`, `1.5s`, `42s`, `5m`, `2m30s`, `3h5m`, `4d2h`.
pub(crate) fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (days, hours, mins, secs) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    let pair = |a: u64, ua: &str, b: u64, ub: &str| {
        if b == 0 {
            format!("{a}{ua}")
        } else {
            format!("{a}{ua}{b}{ub}")
        }
    };
    match s {
        0 if d.subsec_millis() == 0 => "0s".into(),
        0 => format!("{}ms", d.subsec_millis()),
        1..60 if d.subsec_millis() != 0 => {
            let frac = format!("{:03}", d.subsec_millis());
            format!("{s}.{}s", frac.trim_end_matches('0'))
        }
        1..60 => format!("{s}s"),
        60..3600 => pair(mins, "m", secs, "s"),
        3600..86_400 => pair(hours, "h", mins, "m"),
        _ => pair(days, "d", hours, "h"),
    }
}

/// Time left until `not_after_ms`, roughly.
pub(crate) fn time_left(not_after_ms: u64) -> String {
    if not_after_ms == 0 {
        return "-".into();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    match not_after_ms.checked_sub(now) {
        None => "expired".into(),
        Some(ms) => format_duration(std::time::Duration::from_secs(ms / 1000)),
    }
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC, to the second: `2023-11-14T22:13:20Z`.
pub(crate) fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (y, m, d) = civil_from_days(secs / 86_400);
    let t = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's
/// `civil_from_days`, for non-negative day counts).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn energies() {
        assert_eq!(energy(0), "0 J");
        assert_eq!(energy(850_000), "850 J");
        assert_eq!(energy(5_400_000), "5.4 kJ");
        assert_eq!(energy(12_300_000_000), "12.3 MJ");
        assert_eq!(energy(360_000_000_000), "100.0 kWh");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("3h"), Some(Duration::from_secs(10_800)));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        for bad in [
            "",
            "5",
            "s",
            "5d",
            "-1s",
            "+1s",
            " 5s",
            "5s ",
            "5 s",
            "1.5s",
            "5S",
            "99999999999999999999s",
            "5124095576030432h",
            "307445734561825861m",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn deadlines_must_be_positive() {
        assert_eq!(positive_duration("5s"), Ok(Duration::from_secs(5)));
        assert!(positive_duration("0ms").is_err());
        assert!(positive_duration("soon").is_err());
    }

    #[test]
    fn whole_seconds_refuse_fractions() {
        assert_eq!(whole_seconds("90s"), Ok(90));
        assert_eq!(whole_seconds("2h"), Ok(7200));
        assert_eq!(whole_seconds("3000ms"), Ok(3));
        assert_eq!(whole_seconds("0s"), Ok(0));
        for bad in ["500ms", "1500ms", "1", "-5s", "", "18446744073709551616s"] {
            assert!(whole_seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn time_limits_are_humantime_in_whole_seconds() {
        for (input, secs) in [
            ("90s", 90),
            ("90m", 5400),
            ("12h", 43_200),
            ("2days", 172_800),
            ("1h30m", 5400),
            ("1h 30m", 5400),
            ("3000ms", 3),
            ("0s", 0),
            ("400d", 34_560_000),
            ("1.5h", 5400),
        ] {
            assert_eq!(time_limit(input), Ok(secs), "{input}");
        }
        for (bad, says) in [
            ("-5m", "cannot be negative"),
            ("-1", "cannot be negative"),
            ("forever", "expected a duration"),
            ("", "expected a duration"),
            ("90", "expected a duration"),
            ("500ms", "whole number of seconds"),
            ("1.5s", "whole number of seconds"),
        ] {
            let err = time_limit(bad).expect_err(bad);
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn sizes() {
        for (input, mib) in [
            ("40GiB", 40_960),
            ("40960MiB", 40_960),
            ("80G", 81_920),
            ("80g", 81_920),
            ("80Gi", 81_920),
            ("1TiB", 1_048_576),
            ("1024", 1024),
            ("0", 0),
            (" 16 GiB ", 16_384),
            ("18446744073709551615", u64::MAX),
        ] {
            assert_eq!(size_mib(input), Ok(mib), "{input}");
        }
        for bad in [
            "",
            "GiB",
            "-1",
            "+1G",
            "1.5G",
            "1e3",
            "0x10",
            "40 GB",
            "80GB",
            "12KiB",
            "18446744073709551616",
            "18014398509481984G",
        ] {
            assert!(size_mib(bad).is_err(), "{bad}");
        }
        assert!(size_mib("80GB").expect_err("refused").contains("ambiguous"));
    }

    #[test]
    fn gib_rounds_half_up() {
        assert_eq!(gib(81_920), "80 GiB");
        assert_eq!(gib(81_559), "80 GiB");
        assert_eq!(gib(511), "0 GiB");
        assert_eq!(gib(512), "1 GiB");
        assert_eq!(gib(u64::MAX), "18014398509481984 GiB");
    }

    #[test]
    fn compact_durations() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(750), "750ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(1050), "1.05s"),
            (Duration::from_secs(42), "42s"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(150), "2m30s"),
            (Duration::from_secs(3 * 3600 + 300), "3h5m"),
            (Duration::from_secs(4 * 86_400 + 7200), "4d2h"),
            (Duration::MAX, "213503982334601d7h"),
        ];
        for (d, want) in cases {
            assert_eq!(format_duration(d), want);
        }
    }

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000_999), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(951_868_799_000), "2000-02-29T23:59:59Z");
        assert_eq!(rfc3339(4_107_542_400_000), "2100-03-01T00:00:00Z");
        assert_eq!(rfc3339(253_402_300_799_000), "9999-12-31T23:59:59Z");
        assert_eq!(rfc3339(u64::MAX), "584556019-04-03T14:25:51Z");
    }
}
