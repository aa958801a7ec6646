//! What the fencing tests share: leases as tight as the config allows, and jobs kept off the
//! leader by a label on the followers.

use gpu_tests::Cluster;

/// Leases as tight as the config allows (`down_after` = 1.5 × `lease`), so a late fence shows.
pub const FAST_FENCING: &str = "[jobs]\nlease = \"2s\"\ndown_after = \"3s\"\nstop_grace = \"2s\"\n";

/// Label every agent of `all` but `leader` `pool=followers`, so a job with that node selector
/// runs on a follower and cutting its node off leaves the leader in place.
pub async fn label_followers(c: &Cluster, leader: u64, all: &[u64]) {
    for node in all.iter().filter(|n| **n != leader) {
        c.label(leader, *node, "pool", "followers")
            .await
            .expect("label");
    }
}
