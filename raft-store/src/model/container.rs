//! Container jobs: the image a job runs in and the host paths bound into it, and the rules both
//! obey (an image reference's grammar, a bind mount's paths, a tenant's allow-list). Pure: which
//! runtime starts the container is the executing node's business.

use serde::{Deserialize, Serialize};

/// Most bind mounts one job may ask for.
pub const MAX_MOUNTS: usize = 32;
/// Longest image reference (registry, path, tag and digest together).
pub const MAX_IMAGE_LEN: usize = 512;
/// Longest path in a mount or an allow-list entry.
pub const MAX_PATH_LEN: usize = 1024;
/// Most entries in one tenant's mount allow-list.
pub const MAX_ALLOWED_MOUNTS: usize = 64;

/// Host directories that are never bound into a job, whatever an allow-list says: the host's
/// configuration, kernel interfaces, devices and boot files (a job reaches devices only
/// through its device list).
pub const NEVER_MOUNTED: &[&str] = &["/etc", "/proc", "/sys", "/dev", "/boot", "/run"];

/// Paths inside the container a mount may not cover: the runtime provides them.
const RUNTIME_OWNED: &[&str] = &["/proc", "/sys", "/dev"];

/// The image a job runs in, and what of the host it sees.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ContainerSpec {
    /// `[registry[:port]/]path[:tag][@sha256:<hex>]`, e.g. `nvcr.io/nvidia/pytorch:24.05-py3`.
    pub image: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// A host path bound into the container.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Mount {
    pub source: String,
    pub target: String,
    #[serde(default)]
    pub read_only: bool,
}

impl std::fmt::Display for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.source, self.target)?;
        if self.read_only {
            f.write_str(":ro")?;
        }
        Ok(())
    }
}

/// Everything a container spec must satisfy on its own (the tenant's allow-list is
/// `check_allowed`).
pub fn validate(spec: &ContainerSpec) -> Result<(), String> {
    image_reference(&spec.image)?;
    if spec.mounts.len() > MAX_MOUNTS {
        return Err(format!("at most {MAX_MOUNTS} mounts per job"));
    }
    let mut targets = std::collections::BTreeSet::new();
    for m in &spec.mounts {
        mount(m)?;
        if !targets.insert(m.target.as_str()) {
            return Err(format!("two mounts onto {}", m.target));
        }
    }
    Ok(())
}

/// The most images a node reports holding (the most recent ones its runtime lists).
pub const MAX_NODE_IMAGES: usize = 256;

/// The name a runtime stores `image` under, so that a job's reference and a node's listing
/// compare: the registry made explicit (`docker.io` when none is named, with `library/` for a
/// one-component path there) and the tag `latest` when neither a tag nor a digest is given.
/// `busybox` → `docker.io/library/busybox:latest`; `localhost/x:1` stays. Podman may resolve a
/// short name through other search registries: such a job is simply not matched.
pub fn canonical_image(image: &str) -> String {
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    let first = name.split('/').next().unwrap_or_default();
    let has_registry = name.contains('/') && (first.contains(['.', ':']) || first == "localhost");
    let mut full = match (has_registry, name.contains('/')) {
        (true, _) => name.to_owned(),
        (false, true) => format!("docker.io/{name}"),
        (false, false) => format!("docker.io/library/{name}"),
    };
    let last = full.rsplit('/').next().unwrap_or_default();
    if !last.contains(':') && digest.is_none() {
        full.push_str(":latest");
    }
    if let Some(d) = digest {
        full.push('@');
        full.push_str(d);
    }
    full
}

/// A node's report of the images it holds: at most `MAX_NODE_IMAGES`, each a canonical image
/// reference.
pub fn node_images(images: &std::collections::BTreeSet<String>) -> Result<(), String> {
    if images.len() > MAX_NODE_IMAGES {
        return Err(format!(
            "a node reports at most {MAX_NODE_IMAGES} images, not {}",
            images.len()
        ));
    }
    for i in images {
        image_reference(i)?;
        if canonical_image(i) != *i {
            return Err(format!("image {i:?} is not in canonical form"));
        }
    }
    Ok(())
}

/// An image reference in the grammar of the distribution spec: an optional registry host
/// (with a port), slash-separated lower-case path components, an optional tag and an
/// optional `sha256` digest.
pub fn image_reference(image: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("image {image:?} is not a valid reference: {why}"));
    if image.is_empty() {
        return bad("empty");
    }
    if image.len() > MAX_IMAGE_LEN {
        return bad(&format!("longer than {MAX_IMAGE_LEN} bytes"));
    }
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let hex = digest.strip_prefix("sha256:");
        let ok = hex.is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if !ok {
            return bad("a digest is sha256: and 64 lower-case hex digits");
        }
    }
    // The tag follows the last ':' after the last '/' (a ':' before it is a registry's port).
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    let (path, tag) = match name[last_slash..].rfind(':') {
        Some(i) => (&name[..last_slash + i], Some(&name[last_slash + i + 1..])),
        None => (name, None),
    };
    if let Some(tag) = tag {
        let first_ok = tag.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        let chars_ok = tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if tag.is_empty() || tag.len() > 128 || !first_ok || !chars_ok {
            return bad("a tag is 1 to 128 of [A-Za-z0-9_.-], not starting with '.' or '-'");
        }
    }
    let mut components: Vec<&str> = path.split('/').collect();
    // A first component with a '.', a ':' or named localhost is a registry host.
    if components.len() > 1 {
        let first = components[0];
        if first.contains(['.', ':']) || first == "localhost" {
            registry_host(first).or_else(|why| bad(&why))?;
            components.remove(0);
        }
    }
    for c in components {
        if !path_component(c) {
            return bad(&format!(
                "path component {c:?} must be lower-case letters and digits, separated by '.', \
                 '_', '__' or '-'"
            ));
        }
    }
    Ok(())
}

/// A registry host name with an optional port.
pub fn registry_host(host: &str) -> Result<(), String> {
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    };
    if let Some(port) = port
        && port.parse::<u16>().map_or(true, |p| p == 0)
    {
        return Err(format!("registry port {port:?} is not a port number"));
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(format!("registry host {name:?} is not a host name"))
    }
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn path_component(c: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = c.as_bytes();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut run = String::new();
    for &b in bytes {
        if alnum(b) {
            if !(run.is_empty()
                || run == "."
                || run == "_"
                || run == "__"
                || run.bytes().all(|s| s == b'-'))
            {
                return false;
            }
            run.clear();
        } else if matches!(b, b'.' | b'_' | b'-') {
            run.push(b as char);
        } else {
            return false;
        }
    }
    true
}

/// A mount's paths: both absolute and normal (no `.`, `..` or empty components, no trailing
/// `/`), without the characters the runtimes' mount syntax gives a meaning (`,` `:`) or control
/// characters; the source neither `/` nor inside a directory that is `NEVER_MOUNTED`; the
/// target not `/` nor over what the runtime provides.
pub fn mount(m: &Mount) -> Result<(), String> {
    normal_path("mount source", &m.source)?;
    normal_path("mount target", &m.target)?;
    if m.source == "/" {
        return Err("the host's root directory cannot be mounted".into());
    }
    if let Some(dir) = NEVER_MOUNTED.iter().find(|d| is_within(&m.source, d)) {
        return Err(format!(
            "mount source {} is inside {dir}, which is never mounted into a job",
            m.source
        ));
    }
    if m.target == "/" {
        return Err("a mount cannot cover the container's root directory".into());
    }
    if let Some(dir) = RUNTIME_OWNED.iter().find(|d| is_within(&m.target, d)) {
        return Err(format!(
            "mount target {} is inside {dir}, which the container runtime provides",
            m.target
        ));
    }
    Ok(())
}

/// An allow-list entry: a normal absolute directory that is not `/` nor inside a directory
/// that is `NEVER_MOUNTED`.
pub fn allowed_entry(dir: &str) -> Result<(), String> {
    normal_path("allowed mount", dir)?;
    if dir == "/" {
        return Err("the host's root directory cannot be allowed for mounts".into());
    }
    if let Some(never) = NEVER_MOUNTED.iter().find(|d| is_within(dir, d)) {
        return Err(format!(
            "allowed mount {dir} is inside {never}, which is never mounted into a job"
        ));
    }
    Ok(())
}

/// Each mount's source must lie within one of `allowed` (the tenant's allow-list: none, no
/// mounts).
pub fn check_allowed(spec: &ContainerSpec, allowed: &[String]) -> Result<(), String> {
    for m in &spec.mounts {
        if !allowed.iter().any(|a| is_within(&m.source, a)) {
            let list = if allowed.is_empty() {
                "it allows none".to_owned()
            } else {
                format!("it allows {}", allowed.join(", "))
            };
            return Err(format!(
                "mount source {} is not in the tenant's allowed mounts ({list})",
                m.source
            ));
        }
    }
    Ok(())
}

fn normal_path(what: &str, p: &str) -> Result<(), String> {
    if p.len() > MAX_PATH_LEN {
        return Err(format!("{what} must be at most {MAX_PATH_LEN} bytes"));
    }
    if !p.starts_with('/') {
        return Err(format!("{what} {p:?} is not an absolute path"));
    }
    if p.chars().any(|c| c.is_control() || c == ',' || c == ':') {
        return Err(format!(
            "{what} {p:?} must not contain ',', ':' or control characters"
        ));
    }
    if p != "/"
        && p[1..]
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(format!(
            "{what} {p:?} must be a normal path: no '..', '.', '//' or trailing '/'"
        ));
    }
    Ok(())
}

/// `path` is `dir` or inside it (component-wise: `/data2` is not inside `/data`).
fn is_within(path: &str, dir: &str) -> bool {
    dir == "/"
        || path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references() {
        for good in [
            "busybox",
            "library/ubuntu:22.04",
            "localhost/gmtest:1",
            "nvcr.io/nvidia/pytorch:24.05-py3",
            "registry.example.com:5000/team/train_env__v2:latest",
            "ghcr.io/a-b/c.d@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "my-registry:5000/x",
        ] {
            assert_eq!(image_reference(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "UPPER/case",
            "a//b",
            "image:",
            "image:-tag",
            "image@sha256:abc",
            "-lead",
            "trail-",
            "registry:0/x",
            "registry:99999/x",
            "a b",
            "../x",
            "x\ny",
        ] {
            assert!(image_reference(bad).is_err(), "{bad:?} accepted");
        }
        assert!(image_reference(&"a".repeat(MAX_IMAGE_LEN + 1)).is_err());
    }

    fn m(source: &str, target: &str) -> Mount {
        Mount {
            source: source.into(),
            target: target.into(),
            read_only: false,
        }
    }

    #[test]
    fn mount_paths() {
        assert_eq!(mount(&m("/data/team", "/data")), Ok(()));
        assert_eq!(mount(&m("/home/alice", "/workspace/home")), Ok(()));
        for (bad, why) in [
            (m("/", "/host"), "root directory"),
            (m("/etc", "/etc"), "never mounted"),
            (m("/etc/shadow", "/x"), "never mounted"),
            (m("/proc/1", "/x"), "never mounted"),
            (m("/data/../etc", "/x"), "normal path"),
            (m("/data/./x", "/x"), "normal path"),
            (m("/data/", "/x"), "normal path"),
            (m("data", "/x"), "absolute"),
            (m("/data", "x"), "absolute"),
            (m("/data", "/"), "root directory"),
            (m("/data", "/dev/shm"), "runtime provides"),
            (m("/data,ro", "/x"), "','"),
            (m("/da\nta", "/x"), "control"),
        ] {
            let e = mount(&bad).expect_err(&bad.to_string());
            assert!(e.contains(why), "{bad}: {e}");
        }
        // `/etcetera` is not inside `/etc`.
        assert_eq!(mount(&m("/etcetera", "/x")), Ok(()));
    }

    #[test]
    fn a_spec_checks_every_mount_and_refuses_two_onto_one_target() {
        let spec = |mounts| ContainerSpec {
            image: "busybox".into(),
            mounts,
        };
        assert_eq!(validate(&spec(vec![m("/a", "/x"), m("/b", "/y")])), Ok(()));
        assert!(validate(&spec(vec![m("/a", "/x"), m("/b", "/x")])).is_err());
        assert!(validate(&spec(vec![m("/a", "/x"); MAX_MOUNTS + 1])).is_err());
    }

    #[test]
    fn the_allow_list_is_component_wise() {
        let spec = |source: &str| ContainerSpec {
            image: "busybox".into(),
            mounts: vec![m(source, "/x")],
        };
        let allowed = vec!["/data".to_owned(), "/scratch/team".to_owned()];
        assert_eq!(check_allowed(&spec("/data"), &allowed), Ok(()));
        assert_eq!(check_allowed(&spec("/data/sets/a"), &allowed), Ok(()));
        assert_eq!(check_allowed(&spec("/scratch/team/x"), &allowed), Ok(()));
        let e = check_allowed(&spec("/data2"), &allowed).expect_err("refused");
        assert!(e.contains("not in the tenant's allowed mounts"), "{e}");
        assert!(check_allowed(&spec("/scratch"), &allowed).is_err());
        let e = check_allowed(&spec("/data"), &[]).expect_err("refused");
        assert!(e.contains("it allows none"), "{e}");
        assert_eq!(
            check_allowed(
                &ContainerSpec {
                    image: "busybox".into(),
                    mounts: vec![]
                },
                &[]
            ),
            Ok(())
        );
    }

    #[test]
    fn allow_list_entries() {
        assert_eq!(allowed_entry("/data"), Ok(()));
        for bad in ["/", "/etc", "/etc/x", "data", "/data/../etc", "/run/user"] {
            assert!(allowed_entry(bad).is_err(), "{bad}");
        }
    }
}
