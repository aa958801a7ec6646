//! A tenant's registry login for one run's image pull: the executor opens the sealed login
//! (itself when it holds the CA key, else through a voter: `RaftPeer.OpenRegistryLogin`, which
//! answers only for a live run placed on the asking node) and writes it as the runtime's auth
//! file in the run directory, 0600 and root's, which the supervisor removes as soon as the
//! pull is over. The password is never logged, never in `container.json` or `env.json`.

use std::path::{Path, PathBuf};

use super::container_supervise::write_private;

/// The auth file's name in a run directory.
const FILE: &str = "registry-auth.json";

/// Where a run's auth file goes.
pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Write the containers-auth.json for `registry` (`{"auths": {REG: {"auth": base64(user:pass)}}}`),
/// readable by its owner (root) alone.
pub(crate) fn write(
    dir: &Path,
    registry: &str,
    username: &str,
    password: &str,
) -> Result<PathBuf, String> {
    let path = path(dir);
    let auth = base64(format!("{username}:{password}").as_bytes());
    let json = serde_json::json!({ "auths": { registry: { "auth": auth } } });
    write_private(&path, json.to_string().as_bytes())
        .map_err(|e| format!("writing the registry login for {registry}: {e}"))?;
    Ok(path)
}

/// Remove the run's auth file (the pull is over, or the run ended).
pub(crate) fn remove(dir: &Path) {
    std::fs::remove_file(path(dir)).ok();
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_standard_one() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("robot:s3cret", "cm9ib3Q6czNjcmV0"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain}");
        }
    }

    #[test]
    fn the_auth_file_is_roots_alone_and_goes_away() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write(dir.path(), "nvcr.io", "robot", "s3cret").expect("written");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        assert_eq!(v["auths"]["nvcr.io"]["auth"], "cm9ib3Q6czNjcmV0");
        remove(dir.path());
        assert!(!path.exists());
    }
}
