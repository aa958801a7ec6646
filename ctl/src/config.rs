//! gpuctl's optional config file (`$GPUCTL_CONFIG`, else `~/.config/gpumesh/gpuctl.toml`): default
//! endpoints and token file, so a shell needs no exports. Flags and environment win over it.
//! `gpu-agent dev` writes one for its local mesh.

use std::path::PathBuf;

use serde::Deserialize;

pub(crate) const DEFAULT_ENDPOINT: &str = "127.0.0.1:7070";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CtlConfig {
    pub endpoint: Option<Vec<String>>,
    pub token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl CtlConfig {
    /// The config file, or defaults when there is none. A file that exists but does not parse
    /// is an error naming it.
    pub(crate) fn load() -> Result<Self, String> {
        let Some(path) = path() else {
            return Ok(Self::default());
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(format!("reading config file {}: {e}", path.display())),
        }
    }
}

fn path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GPUCTL_CONFIG") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config/gpumesh/gpuctl.toml"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_refused() {
        let err = toml::from_str::<CtlConfig>("endpoints = []").expect_err("typo");
        assert!(err.to_string().contains("endpoints"), "{err}");
        let ok: CtlConfig =
            toml::from_str("endpoint = [\"a:1\"]\ntoken_file = \"/t\"").expect("valid");
        assert_eq!(ok.endpoint, Some(vec!["a:1".to_owned()]));
    }
}
