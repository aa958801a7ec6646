//! Byte sizes in the configuration file: a plain integer (bytes) or a string with a binary unit,
//! `"64MiB"`, `"512 KiB"`, `"2GiB"`. Decimal units (`MB`) are refused rather than guessed at.

use std::fmt;

use serde::Deserialize;

/// A number of bytes, as written in the config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

const UNITS: [(&str, u64); 5] = [
    ("B", 1),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
];

impl ByteSize {
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("{text:?} is not a size (write e.g. 65536, \"64MiB\")"))?;
        let unit = unit.trim();
        let scale = if unit.is_empty() {
            1
        } else {
            UNITS
                .iter()
                .find(|(name, _)| *name == unit)
                .map(|(_, scale)| *scale)
                .ok_or_else(|| {
                    format!("{text:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB or TiB)")
                })?
        };
        n.checked_mul(scale)
            .map(ByteSize)
            .ok_or_else(|| format!("{text:?} is too large"))
    }
}

/// The largest unit that divides the size exactly (`64MiB`, `1000B`), so messages show what an
/// operator would have written.
impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, scale) = UNITS
            .iter()
            .rev()
            .find(|(_, scale)| self.0 != 0 && self.0.is_multiple_of(*scale))
            .copied()
            .unwrap_or(("B", 1));
        write!(f, "{}{name}", self.0 / scale)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(n) => Ok(ByteSize(n)),
            Raw::Text(t) => ByteSize::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units_only() {
        for (text, want) in [
            ("0", 0),
            ("4096", 4096),
            ("64MiB", 64 << 20),
            ("512 KiB", 512 << 10),
            (" 2GiB ", 2 << 30),
            ("7B", 7),
        ] {
            assert_eq!(ByteSize::parse(text), Ok(ByteSize(want)), "{text:?}");
        }
        for bad in [
            "",
            "MiB",
            "-1",
            "1.5GiB",
            "10MB",
            "10 mib",
            "99999999999TiB",
        ] {
            assert!(ByteSize::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(ByteSize(64 << 20).to_string(), "64MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
        assert_eq!(ByteSize(0).to_string(), "0B");
    }
}
