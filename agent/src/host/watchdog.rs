//! The systemd watchdog: `WATCHDOG=1` every half `WATCHDOG_USEC`, but only while the agent is
//! really alive — the Raft core answers a request through its message loop and the replicated
//! state can be read (neither lock nor loop wedged). A wedged agent stops pinging and systemd
//! restarts it (`WatchdogSec=`, `Restart=on-failure`).

use std::time::Duration;

use gpu_raft_store::{Raft, StateReader};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::host::sd_notify::SdNotify;

pub(crate) struct Watchdog {
    pub raft: Raft,
    pub state: StateReader,
    pub notify: SdNotify,
    /// Half the manager's timeout.
    pub interval: Duration,
}

impl Watchdog {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            match tokio::time::timeout(self.interval, self.probe()).await {
                Ok(Ok(())) => {
                    if let Err(e) = self.notify.watchdog() {
                        warn!(error = %e, "could not ping the systemd watchdog");
                    }
                }
                Ok(Err(why)) => warn!(why, "not alive: withholding the watchdog ping"),
                Err(_) => warn!(
                    within = ?self.interval,
                    "the liveness probe did not answer: withholding the watchdog ping"
                ),
            }
        }
    }

    /// One round trip through the Raft core, and a read of the state machine's replica.
    async fn probe(&self) -> Result<(), &'static str> {
        self.raft
            .with_raft_state(|_| ())
            .await
            .map_err(|_| "raft has stopped")?;
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || state.read(|s| s.nodes.len()))
            .await
            .map_err(|_| "reading the replica failed")?;
        Ok(())
    }
}
