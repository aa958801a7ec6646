//! The run's seed: a fixed default per scenario, overridden by `GPUMESH_CHAOS_SEED`; and the
//! seeded pauses the faults take between their steps.

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;

/// The environment variable that overrides every scenario's seed.
pub const SEED_ENV: &str = "GPUMESH_CHAOS_SEED";

/// `GPUMESH_CHAOS_SEED` when set (decimal or `0x` hex), else `default`.
pub fn seed_or(default: u64) -> anyhow::Result<u64> {
    match std::env::var(SEED_ENV) {
        Ok(s) => parse(&s),
        Err(std::env::VarError::NotPresent) => Ok(default),
        Err(e) => anyhow::bail!("{SEED_ENV}: {e}"),
    }
}

/// A seed written in decimal or `0x` hex.
pub fn parse(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let parsed = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|e| anyhow::anyhow!("{SEED_ENV}={s:?}: {e}"))
}

/// Sleep `lo..hi` milliseconds, drawn from the scenario's seeded RNG.
pub async fn sleep_ms(rng: &mut StdRng, lo: u64, hi: u64) {
    tokio::time::sleep(Duration::from_millis(rng.random_range(lo..hi))).await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_decimal_and_hex() {
        assert_eq!(super::parse("42").ok(), Some(42));
        assert_eq!(super::parse("0x2a").ok(), Some(42));
        assert!(super::parse("nope").is_err());
    }
}
