//! A write forwarded to a leader that has just been cut off moves to the new leader once one
//! is elected, instead of waiting on the unreachable old one for its whole deadline.

use gpu_chaos::partition::Cut;
use gpu_chaos::ready::cluster_in_namespaces;
use gpu_tests::shell_job;

/// Regression: a follower that still believed in the old leader forwarded the write to it and
/// waited for the answer (the peer call's deadline was the whole operation's, ~6 s); the cut
/// leader never answered, so the write failed even though the majority had elected a new
/// leader a second or two later (about 5 s of failed writes in C5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_forwarded_to_a_cut_off_leader_moves_to_the_new_one() {
    let Some((net, c)) = cluster_in_namespaces(3, "", "the partition test")
        .await
        .expect("namespaces")
    else {
        return;
    };
    let all = [1, 2, 3];
    let old = c.leader().await;
    let via = all.iter().copied().find(|n| *n != old).expect("a follower");
    // The follower hears of the cut only when its leader lease runs out: the write it is given
    // right away goes to the old leader first.
    Cut::isolate(old, &all).apply(&net, &all).expect("isolate");
    let written = c
        .submit(
            via,
            shell_job("through-the-cut", 0, "true"),
            "through-the-cut",
        )
        .await;
    let leader_now = c.status(via, true).await.ok().and_then(|s| s.leader_id);
    assert!(
        written.is_ok(),
        "the write through n{via} failed though n{leader_now:?} leads now: {written:?}\n{}",
        c.logs()
    );
}
