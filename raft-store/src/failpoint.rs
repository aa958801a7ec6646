//! Named failpoints for chaos tests, compiled in only with the `failpoints` feature (without
//! it every function here is a constant no-op and the `fail` crate is not even built).
//!
//! A failpoint build reads `FAIL_POINTS` once at start (`setup`), in the `fail` crate's syntax:
//! `name=action;name=action`, where an action is `[p%][count*]task[->action]`, e.g.
//! `log-append-before-fsync=40*off->return`. The task `return` switches a point on; what that
//! does depends on the point's kind:
//!
//! - `crash`: the process exits right there with `CRASH_EXIT` (no destructor, no flush: as
//!   `kill -9` at that line). Points: `vote-save-before-fsync`, `vote-save-after-fsync`,
//!   `log-append-before-fsync`, `log-append-after-fsync` (durable, not yet reported; both
//!   count the flusher's flushes of appended entries, one or more appends each),
//!   `apply-before`, `apply-after` (applied in memory, not yet returned),
//!   `snapshot-build-before-write`, `snapshot-build-after-write`,
//!   `snapshot-install-before-write`, `snapshot-install-after-write`,
//!   `snapshot-file-before-rename` (new snapshot fsynced beside the old one).
//! - `error`: the I/O fails. `fsync-error`: every sled flush (vote, log append, purge) returns
//!   an I/O error.
//! - `broken`: a deliberate bug, so tests can show the checkers catch it.
//!   `apply-bind-forgets-gpus`: `apply` binds a job without marking its GPUs held, so neither
//!   the scheduler nor the bind re-check sees them taken and two jobs share a GPU.
//!
//! Every name above is in `NAMES`; `setup` refuses a `FAIL_POINTS` naming anything else.

/// Every failpoint, by kind.
pub const CRASH: &[&str] = &[
    "vote-save-before-fsync",
    "vote-save-after-fsync",
    "log-append-before-fsync",
    "log-append-after-fsync",
    "apply-before",
    "apply-after",
    "snapshot-build-before-write",
    "snapshot-build-after-write",
    "snapshot-install-before-write",
    "snapshot-install-after-write",
    "snapshot-file-before-rename",
];
/// Points that make I/O fail.
pub const ERROR: &[&str] = &["fsync-error"];
/// Points that switch on a deliberate bug.
pub const BROKEN: &[&str] = &["apply-bind-forgets-gpus"];

/// Whether this build has failpoints at all.
pub const ENABLED: bool = cfg!(feature = "failpoints");

/// Configure the points named in `FAIL_POINTS` (a no-op without the feature). Returns the
/// names switched on; `Err` names an unknown point or a malformed action.
pub fn setup() -> Result<Vec<String>, String> {
    match std::env::var("FAIL_POINTS") {
        Ok(spec) => setup_from(&spec),
        Err(_) => Ok(Vec::new()),
    }
}

/// `setup` for the value `spec` of `FAIL_POINTS`.
pub fn setup_from(spec: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for part in spec.split(';').filter(|p| !p.trim().is_empty()) {
        let (name, action) = part
            .split_once('=')
            .ok_or_else(|| format!("FAIL_POINTS: {part:?} is not name=action"))?;
        let name = name.trim();
        if ![CRASH, ERROR, BROKEN].concat().contains(&name) {
            return Err(format!("FAIL_POINTS: unknown failpoint {name:?}"));
        }
        configure(name, action.trim())?;
        names.push(name.to_owned());
    }
    Ok(names)
}

#[cfg(feature = "failpoints")]
fn configure(name: &str, action: &str) -> Result<(), String> {
    fail::cfg(name, action).map_err(|e| format!("FAIL_POINTS: {name}={action}: {e}"))
}

#[cfg(not(feature = "failpoints"))]
fn configure(name: &str, _action: &str) -> Result<(), String> {
    Err(format!(
        "FAIL_POINTS names {name:?}, but this binary was built without the failpoints feature"
    ))
}

/// Whether point `name` fires now (always `false` without the feature).
#[inline]
pub fn on(name: &'static str) -> bool {
    #[cfg(feature = "failpoints")]
    {
        fail::eval(name, |_| ()).is_some()
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        false
    }
}

/// The exit status of a process a `crash` point ended.
pub const CRASH_EXIT: i32 = 86;

/// A `crash` point: end the process here when `name` fires, with `CRASH_EXIT` and without
/// running any destructor (nothing buffered is flushed; unlike `abort`, no core file).
#[inline]
pub fn crash(name: &'static str) {
    if on(name) {
        eprintln!("failpoint {name}: crashing the process");
        std::process::exit(CRASH_EXIT);
    }
}

/// An `error` point: the I/O error to return when `name` fires.
#[inline]
pub fn io_error(name: &'static str) -> std::io::Result<()> {
    if on(name) {
        Err(std::io::Error::other(format!("failpoint {name}")))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_specs_are_refused_by_name() {
        let err = setup_from("no-such-point=return").expect_err("unknown");
        assert!(err.contains("unknown failpoint \"no-such-point\""), "{err}");
        let err = setup_from("apply-before").expect_err("no action");
        assert!(err.contains("is not name=action"), "{err}");
        assert_eq!(setup_from(" ; "), Ok(Vec::new()));
    }

    #[cfg(not(feature = "failpoints"))]
    #[test]
    fn without_the_feature_a_point_is_refused_and_never_fires() {
        let err = setup_from("apply-before=return").expect_err("no feature");
        assert!(
            err.contains("built without the failpoints feature"),
            "{err}"
        );
        assert!(!on("apply-before"));
        assert!(io_error("fsync-error").is_ok());
    }

    #[cfg(feature = "failpoints")]
    #[test]
    fn a_configured_point_fires_as_its_action_says() {
        // A point no code has (the registry is process-wide; tests run in parallel).
        const POINT: &str = "test-only-point";
        configure(POINT, "2*off->return").expect("configure");
        assert!(!on(POINT));
        assert!(!on(POINT));
        assert!(on(POINT));
        assert!(io_error(POINT).is_err());
        fail::remove(POINT);
        assert!(!on(POINT));
        assert!(configure(POINT, "bogus(").is_err());
    }
}
