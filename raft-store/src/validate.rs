//! Domain input rules shared by the API edge (early, friendly errors) and `apply` (authoritative).

use std::collections::BTreeMap;

/// Most labels one node may carry.
pub const MAX_LABELS: usize = 64;
const MAX_KEY_LEN: usize = 63;
const MAX_VALUE_LEN: usize = 255;
/// Longest advertised address accepted (`host:port`).
pub const MAX_ADDR_LEN: usize = 255;

/// A label key: 1–63 characters of `[A-Za-z0-9._/-]`, starting with an alphanumeric, no `..`.
pub fn label_key(key: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-');
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(format!("label key must be 1..={MAX_KEY_LEN} characters"));
    }
    if !key.starts_with(|c: char| c.is_ascii_alphanumeric()) || !key.chars().all(ok_char) {
        return Err(format!(
            "label key {key:?} must match [A-Za-z0-9][A-Za-z0-9._/-]*"
        ));
    }
    if key.contains("..") {
        return Err(format!("label key {key:?} must not contain '..'"));
    }
    Ok(())
}

/// A label value: at most 255 characters, printable, no control characters.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_VALUE_LEN {
        return Err(format!("label value must be at most {MAX_VALUE_LEN} bytes"));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("label value {value:?} contains control characters"));
    }
    Ok(())
}

/// A whole label map, including its size.
pub fn labels(labels: &BTreeMap<String, String>) -> Result<(), String> {
    if labels.len() > MAX_LABELS {
        return Err(format!(
            "at most {MAX_LABELS} labels per node, got {}",
            labels.len()
        ));
    }
    for (k, v) in labels {
        label_key(k)?;
        label_value(v)?;
    }
    Ok(())
}

/// An advertised address: `host:port`, printable, bounded.
pub fn addr(addr: &str) -> Result<(), String> {
    if addr.is_empty() || addr.len() > MAX_ADDR_LEN || addr.chars().any(|c| c.is_control()) {
        return Err(format!(
            "address {addr:?} must be 1..={MAX_ADDR_LEN} printable characters"
        ));
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(format!("address {addr:?} must be host:port")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys() {
        for good in [
            "gpu_type",
            "site",
            "topology.kubernetes.io/zone",
            "a",
            "A-1",
        ] {
            assert_eq!(label_key(good), Ok(()), "{good}");
        }
        let long = "k".repeat(64);
        for bad in [
            "",
            "-a",
            "/etc",
            "../x",
            "a..b",
            "a b",
            "a\nb",
            "\u{1b}[31m",
            long.as_str(),
        ] {
            assert!(label_key(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn label_values() {
        assert_eq!(label_value(""), Ok(()));
        assert_eq!(label_value("A100 80GB"), Ok(()));
        assert!(label_value("a\0b").is_err());
        assert!(label_value("\u{1b}[2J").is_err());
        assert!(label_value(&"v".repeat(1 << 20)).is_err());
    }

    #[test]
    fn label_maps_are_bounded() {
        let many: BTreeMap<String, String> = (0..100_000)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(labels(&many).is_err());
    }

    #[test]
    fn addrs() {
        assert_eq!(addr("127.0.0.1:7070"), Ok(()));
        assert_eq!(addr("[::1]:7070"), Ok(()));
        for bad in ["", "host", ":80", "h:99999", "h:p", "a\n:1"] {
            assert!(addr(bad).is_err(), "{bad:?}");
        }
    }
}
