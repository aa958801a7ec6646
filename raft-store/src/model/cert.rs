//! Certificates the cluster CA issued, and the revocation list. Agents refuse a connection whose
//! certificate serial is revoked here as soon as they apply the revocation (one commit).

use serde::{Deserialize, Serialize};

/// One certificate as the cluster knows it. A revocation of a serial the cluster never recorded
/// (one signed offline with the CA key) is kept as a record with an empty subject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertRecord {
    /// Lower-case hex of the serial number.
    pub serial: String,
    /// `node 3`, `client alice`, or empty when unknown.
    #[serde(default)]
    pub subject: String,
    #[serde(default)]
    pub not_after_ms: u64,
    #[serde(default)]
    pub issued_at_ms: u64,
    #[serde(default)]
    pub revoked: bool,
    #[serde(default)]
    pub revoked_reason: String,
    /// The key id of the CA that signed it; empty for certificates recorded before the first
    /// CA rotation (the cluster's first CA signed them) and by agents older than protocol 8.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub issuer: String,
}

/// A serial as certificates carry it: 1–20 bytes of lower-case hex.
pub fn check_serial(serial: &str) -> Result<(), String> {
    let ok = (2..=40).contains(&serial.len())
        && serial.len().is_multiple_of(2)
        && serial
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "certificate serial must be 1 to 20 bytes of lower-case hex, got {serial:?}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials() {
        assert!(check_serial("0a1b").is_ok());
        for bad in ["", "a", "0A", "zz", &"ab".repeat(21)] {
            assert!(check_serial(bad).is_err(), "{bad}");
        }
    }
}
