//! The executor's client of systemd's D-Bus API (`org.freedesktop.systemd1.Manager`): start a
//! run's transient unit and wait until systemd has executed it, and hear when units go away.
//!
//! It talks to systemd through the system bus. Not through the manager's private socket
//! (`/run/systemd/private`, what `systemctl` uses as root): on that direct connection systemd
//! stamps its messages with the sender `org.freedesktop.systemd1`, a well-known name where the
//! D-Bus specification has a unique one, and zbus refuses such a message from inside its
//! socket reader (a panic in that task, tried against systemd 252), so no call would ever be
//! answered. A dropped connection (the bus restarted, say) is opened again on the next call.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Mutex;
use zbus::zvariant::{OwnedObjectPath, Value as DbusValue};
use zbus::{Connection, MatchRule, MessageStream, message};

use super::systemd_unit::Value;

const DESTINATION: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";

/// How long a start may take before it counts as failed: systemd runs `ExecStart` of a
/// `Type=exec` unit within milliseconds unless it is wedged.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Every D-Bus call's own deadline.
const CALL_TIMEOUT: Duration = Duration::from_secs(25);

/// A connection to the service manager, opened again when it drops.
pub(crate) struct SystemdBus {
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for SystemdBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SystemdBus")
    }
}

impl SystemdBus {
    /// Connect and ask the manager its version (which proves it answers). `Err` says why not.
    pub(crate) async fn connect() -> Result<(Self, String), String> {
        let conn = open().await?;
        let version = version(&conn).await?;
        Ok((
            Self {
                conn: Mutex::new(conn),
            },
            version,
        ))
    }

    /// The live connection, reopened if the last one broke.
    async fn connection(&self) -> Result<Connection, String> {
        let mut conn = self.conn.lock().await;
        if version(&conn).await.is_err() {
            *conn = open().await?;
        }
        Ok(conn.clone())
    }

    /// Start unit `name` with `props` and wait until systemd has executed its `ExecStart`
    /// (the start job's result is `done`). `Err` is systemd's reason, for the run's outcome.
    pub(crate) async fn start_transient_unit(
        &self,
        name: &str,
        props: &[(&'static str, Value)],
    ) -> Result<(), String> {
        let conn = self.connection().await?;
        // Listen before asking, so the job's end cannot pass unheard.
        let mut removed = signals(&conn, "JobRemoved").await?;
        let props: Vec<(&str, DbusValue<'_>)> =
            props.iter().map(|(k, v)| (*k, encode(v))).collect();
        let aux: Vec<(&str, Vec<(&str, DbusValue<'_>)>)> = Vec::new();
        let reply = tokio::time::timeout(
            CALL_TIMEOUT,
            conn.call_method(
                Some(DESTINATION),
                PATH,
                Some(MANAGER),
                "StartTransientUnit",
                &(name, "fail", props, aux),
            ),
        )
        .await
        .map_err(|_| format!("systemd did not answer StartTransientUnit for {name}"))?
        .map_err(|e| format!("systemd refused to start {name}: {}", error_text(&e)))?;
        let job: OwnedObjectPath = reply
            .body()
            .deserialize()
            .map_err(|e| format!("systemd's answer to StartTransientUnit: {e}"))?;
        let waited = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(msg) = removed.next().await {
                let Ok(msg) = msg else { continue };
                let Ok((_, path, _, result)) = msg
                    .body()
                    .deserialize::<(u32, OwnedObjectPath, String, String)>()
                else {
                    continue;
                };
                if path == job {
                    return Some(result);
                }
            }
            None
        })
        .await;
        match waited {
            Ok(Some(result)) if result == "done" => Ok(()),
            Ok(Some(result)) => Err(format!(
                "systemd could not start {name}: its start job ended {result:?} (journalctl -u {name})"
            )),
            Ok(None) => Err(format!(
                "the connection to systemd closed while {name} was starting"
            )),
            Err(_) => {
                // Started late or never: make sure it does not run unrecorded.
                self.stop_unit(name).await.ok();
                Err(format!(
                    "systemd did not start {name} within {}s",
                    START_TIMEOUT.as_secs()
                ))
            }
        }
    }

    /// Ask systemd to stop a unit (best effort; the run's supervisor is normally stopped
    /// through its pid).
    pub(crate) async fn stop_unit(&self, name: &str) -> Result<(), String> {
        let conn = self.connection().await?;
        conn.call_method(
            Some(DESTINATION),
            PATH,
            Some(MANAGER),
            "StopUnit",
            &(name, "replace"),
        )
        .await
        .map(drop)
        .map_err(|e| error_text(&e))
    }

    /// The names of units as systemd unloads them (`UnitRemoved`). Ends when the connection
    /// does.
    pub(crate) async fn removed_units(
        &self,
    ) -> Result<impl futures::Stream<Item = String> + use<>, String> {
        let conn = self.connection().await?;
        let stream = signals(&conn, "UnitRemoved").await?;
        Ok(stream.filter_map(|msg| async move {
            msg.ok()?
                .body()
                .deserialize::<(String, OwnedObjectPath)>()
                .ok()
                .map(|(name, _)| name)
        }))
    }
}

/// The system bus, subscribed to the manager's signals (systemd sends them only to
/// subscribers).
async fn open() -> Result<Connection, String> {
    let conn = match zbus::connection::Builder::system() {
        Ok(b) => b.method_timeout(CALL_TIMEOUT).build().await,
        Err(e) => Err(e),
    }
    .map_err(|e| format!("connecting to the system bus: {e}"))?;
    conn.call_method(Some(DESTINATION), PATH, Some(MANAGER), "Subscribe", &())
        .await
        .map_err(|e| format!("subscribing to systemd's signals: {}", error_text(&e)))?;
    Ok(conn)
}

/// The manager's `Version` property.
async fn version(conn: &Connection) -> Result<String, String> {
    let reply = conn
        .call_method(
            Some(DESTINATION),
            PATH,
            Some("org.freedesktop.DBus.Properties"),
            "Get",
            &(MANAGER, "Version"),
        )
        .await
        .map_err(|e| format!("asking systemd its version: {}", error_text(&e)))?;
    let value: zbus::zvariant::OwnedValue = reply
        .body()
        .deserialize()
        .map_err(|e| format!("systemd's version: {e}"))?;
    String::try_from(value).map_err(|e| format!("systemd's version: {e}"))
}

/// The manager's signal `member`.
async fn signals(conn: &Connection, member: &'static str) -> Result<MessageStream, String> {
    // The bus checks the sender (only systemd may own its name); zbus the rest.
    let rule = MatchRule::builder()
        .msg_type(message::Type::Signal)
        .sender(DESTINATION)
        .and_then(|b| b.path(PATH))
        .and_then(|b| b.interface(MANAGER))
        .and_then(|b| b.member(member))
        .map_err(|e| e.to_string())?
        .build();
    MessageStream::for_match_rule(rule, conn, Some(1024))
        .await
        .map_err(|e| format!("listening for systemd's {member}: {e}"))
}

/// One property value in the D-Bus type systemd expects.
fn encode(v: &Value) -> DbusValue<'_> {
    match v {
        Value::Str(s) => DbusValue::from(s.as_str()),
        Value::Bool(b) => DbusValue::from(*b),
        Value::U64(n) => DbusValue::from(*n),
        Value::Strs(list) => DbusValue::from(list.iter().map(String::as_str).collect::<Vec<_>>()),
        Value::Exec { path, argv } => DbusValue::from(vec![(
            path.as_str(),
            argv.iter().map(String::as_str).collect::<Vec<_>>(),
            false,
        )]),
        Value::Devices(list) => DbusValue::from(
            list.iter()
                .map(|(d, a)| (d.as_str(), a.as_str()))
                .collect::<Vec<_>>(),
        ),
    }
}

/// systemd's own text for a refused call (`org.freedesktop.systemd1.UnitExists: Unit … already
/// exists.`), else zbus's.
fn error_text(e: &zbus::Error) -> String {
    match e {
        zbus::Error::MethodError(name, Some(text), _) => format!("{text} ({name})"),
        other => other.to_string(),
    }
}
