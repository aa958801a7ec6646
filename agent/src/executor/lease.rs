//! The node lease: while this agent is in contact with the cluster (it leads with a recent
//! quorum acknowledgement, or it recently heard from the leader), it renews a lease file whose
//! modification time is that last contact — not the moment of renewal, so the lease runs out
//! `lease` after contact was lost however late the last renewal came. Every job supervisor on
//! the node stops its job when the file grows older than the lease — the node fences itself
//! before the leader (waiting longer) declares it down and re-places its jobs.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::raft::Cluster;
use crate::raft::contact::ContactBook;

/// How long ago the lease file was last renewed; `None` when it is missing or unreadable.
pub(crate) fn lease_age(path: &std::path::Path) -> Option<Duration> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    Some(modified.elapsed().unwrap_or_default())
}

pub(crate) struct LeaseKeeper {
    pub cluster: Cluster,
    pub path: PathBuf,
    pub lease: Duration,
}

impl LeaseKeeper {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let every = (self.lease / 4).max(Duration::from_millis(100));
        let mut held = true;
        loop {
            let contact = self.last_contact();
            let in_contact = contact.is_some();
            if let Some(at) = contact
                && let Err(e) = renew(&self.path, at)
            {
                warn!(error = %e, path = %self.path.display(), "cannot renew the node lease");
            }
            if in_contact != held {
                info!(
                    in_contact,
                    "node lease {}",
                    if in_contact {
                        "renewed again"
                    } else {
                        "no longer renewed"
                    }
                );
                held = in_contact;
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
    }

    fn last_contact(&self) -> Option<Instant> {
        let view = self.cluster.view();
        let me = view.is_leader.then_some(view.node_id);
        last_contact(&self.cluster.contacts, me, &view.voters, self.lease)
    }
}

/// The contact the lease runs from, if it is younger than `lease`. A follower (`leader` is
/// `None`): when it last accepted replication from a leader. The leader (`leader` is its own
/// id): the moment by which a majority of `voters`, itself included, had last answered it.
pub(crate) fn last_contact(
    contacts: &ContactBook,
    leader: Option<u64>,
    voters: &std::collections::BTreeSet<u64>,
    lease: Duration,
) -> Option<Instant> {
    let at = match leader {
        None => contacts.leader_heard_at()?,
        Some(me) => {
            let now = Instant::now();
            let mut heard: Vec<Option<Instant>> = voters
                .iter()
                .map(|v| {
                    if *v == me {
                        Some(now)
                    } else {
                        contacts.last_heard(*v)
                    }
                })
                .collect();
            // Most recent first; never heard of sorts last.
            heard.sort_unstable_by(|a, b| b.cmp(a));
            (*heard.get(voters.len() / 2)?)?
        }
    };
    (at.elapsed() < lease).then_some(at)
}

/// Write the lease file and date it at the contact `at`.
fn renew(path: &std::path::Path, at: Instant) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(crate::clock::now_ms().to_string().as_bytes())?;
    let dated = SystemTime::now()
        .checked_sub(at.elapsed())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    file.set_modified(dated)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(2);

    #[test]
    fn a_follower_lease_runs_from_its_last_contact_with_the_leader() {
        let contacts = ContactBook::default();
        let voters = [1, 2, 3].into_iter().collect();
        assert_eq!(last_contact(&contacts, None, &voters, LEASE), None);
        contacts.heard_from_leader();
        std::thread::sleep(Duration::from_millis(300));
        let at = last_contact(&contacts, None, &voters, LEASE).expect("in contact");
        assert!(at.elapsed() >= Duration::from_millis(300));
        // Renewed now, the file is dated at the contact: it expires `lease` after it.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lease");
        renew(&path, at).expect("renew");
        let age = lease_age(&path).expect("age");
        assert!(age >= Duration::from_millis(290), "{age:?}");
        assert_eq!(
            last_contact(&contacts, None, &voters, Duration::from_millis(100)),
            None,
            "older than the lease"
        );
    }

    #[test]
    fn a_leader_lease_runs_from_when_a_majority_last_answered() {
        let contacts = ContactBook::default();
        let voters = [1, 2, 3].into_iter().collect();
        assert_eq!(last_contact(&contacts, Some(1), &voters, LEASE), None);
        contacts.heard_from(2);
        std::thread::sleep(Duration::from_millis(200));
        contacts.heard_from(3);
        let at = last_contact(&contacts, Some(1), &voters, LEASE).expect("majority");
        // Itself and n3 (the most recent) make a majority.
        assert!(
            at.elapsed() < Duration::from_millis(150),
            "{:?}",
            at.elapsed()
        );
        let five = [1, 2, 3, 4, 5].into_iter().collect();
        assert_eq!(
            last_contact(&contacts, Some(1), &five, LEASE)
                .map(|t| t.elapsed() >= Duration::from_millis(200)),
            Some(true),
            "of five voters, n2 is the third answer"
        );
    }
}
