//! The systemd notification protocol (`sd_notify(3)`): `READY=1`, `WATCHDOG=1` and `STOPPING=1`
//! as datagrams to the unix socket named by `NOTIFY_SOCKET` (a path, or `@name` for an abstract
//! socket), and the watchdog interval from `WATCHDOG_USEC` / `WATCHDOG_PID`. Without
//! `NOTIFY_SOCKET` (not started by systemd with `Type=notify`) every call is a no-op.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::time::Duration;

/// Where notifications go, read once from the environment at start.
#[derive(Clone, Debug, Default)]
pub(crate) struct SdNotify {
    target: Option<Target>,
    watchdog: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    Path(PathBuf),
    Abstract(Vec<u8>),
}

impl SdNotify {
    /// From `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` of this process.
    pub(crate) fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok();
        Self::from_vars(
            var("NOTIFY_SOCKET").as_deref(),
            var("WATCHDOG_USEC").as_deref(),
            var("WATCHDOG_PID").as_deref(),
            std::process::id(),
        )
    }

    /// The pure reading of the three variables (`pid`: this process).
    fn from_vars(
        socket: Option<&str>,
        watchdog_usec: Option<&str>,
        watchdog_pid: Option<&str>,
        pid: u32,
    ) -> Self {
        let target = socket.and_then(|s| match s.strip_prefix('@') {
            Some(name) if !name.is_empty() => Some(Target::Abstract(name.as_bytes().to_vec())),
            Some(_) => None,
            None if s.starts_with('/') => Some(Target::Path(PathBuf::from(s))),
            None => None,
        });
        // The watchdog is meant for us unless WATCHDOG_PID names another process.
        let ours = watchdog_pid.is_none_or(|p| p.trim().parse::<u32>().ok() == Some(pid));
        let watchdog = watchdog_usec
            .and_then(|u| u.trim().parse::<u64>().ok())
            .filter(|&u| u > 0 && ours)
            .map(Duration::from_micros);
        Self { target, watchdog }
    }

    /// Whether a service manager listens.
    pub(crate) fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// How often to send `WATCHDOG=1` (half the manager's timeout), when it asked for them.
    pub(crate) fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.filter(|_| self.enabled()).map(|d| d / 2)
    }

    /// Send one notification (`KEY=VALUE` lines). A no-op without a manager.
    pub(crate) fn notify(&self, message: &str) -> std::io::Result<()> {
        let Some(target) = &self.target else {
            return Ok(());
        };
        let addr = match target {
            Target::Path(p) => SocketAddr::from_pathname(p)?,
            Target::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name)?
            }
        };
        let socket = UnixDatagram::unbound()?;
        let sent = socket.send_to_addr(message.as_bytes(), &addr)?;
        if sent != message.len() {
            return Err(std::io::Error::other("notification datagram cut short"));
        }
        Ok(())
    }

    pub(crate) fn ready(&self) -> std::io::Result<()> {
        self.notify("READY=1\nSTATUS=joined and caught up")
    }

    pub(crate) fn stopping(&self) -> std::io::Result<()> {
        self.notify("STOPPING=1\nSTATUS=shutting down")
    }

    pub(crate) fn watchdog(&self) -> std::io::Result<()> {
        self.notify("WATCHDOG=1")
    }

    pub(crate) fn status(&self, status: &str) -> std::io::Result<()> {
        self.notify(&format!("STATUS={status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_environment_like_sd_notify() {
        let n = SdNotify::from_vars(Some("/run/systemd/notify"), Some("30000000"), None, 7);
        assert_eq!(n.target, Some(Target::Path("/run/systemd/notify".into())));
        assert_eq!(n.watchdog_interval(), Some(Duration::from_secs(15)));

        let n = SdNotify::from_vars(Some("@sd-abc"), Some("2000000"), Some("7"), 7);
        assert_eq!(n.target, Some(Target::Abstract(b"sd-abc".to_vec())));
        assert_eq!(n.watchdog_interval(), Some(Duration::from_secs(1)));

        // The watchdog belongs to another process, is zero or garbage: no pings.
        for (usec, pid) in [("2000000", Some("8")), ("0", None), ("soon", None)] {
            let n = SdNotify::from_vars(Some("/x"), Some(usec), pid, 7);
            assert_eq!(n.watchdog_interval(), None, "{usec} {pid:?}");
        }
        // Relative paths and an empty abstract name are not sockets sd_notify would use.
        for socket in [None, Some("relative"), Some("@"), Some("")] {
            let n = SdNotify::from_vars(socket, Some("2000000"), None, 7);
            assert!(!n.enabled(), "{socket:?}");
            assert_eq!(n.watchdog_interval(), None);
            n.ready().expect("a no-op without a manager");
        }
    }

    #[test]
    fn sends_datagrams_to_a_path_and_an_abstract_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).expect("bind");
        let n = SdNotify::from_vars(path.to_str(), None, None, 1);
        n.ready().expect("send");
        let mut buf = [0u8; 256];
        let len = listener.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=joined and caught up");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("gpumesh-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
        let listener = UnixDatagram::bind_addr(&addr).expect("bind abstract");
        let n = SdNotify::from_vars(Some(&format!("@{name}")), None, None, 1);
        n.stopping().expect("send");
        let len = listener.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..len], b"STOPPING=1\nSTATUS=shutting down");

        // Nobody listening: an error, not a hang or a panic.
        drop(listener);
        assert!(n.watchdog().is_err());
    }
}
