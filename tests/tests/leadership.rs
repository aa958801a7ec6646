//! Leadership transfer with real agents (`gpuctl cluster transfer-leader`): to a named voter,
//! or to the best one; refused, changing nothing, for a learner, a non-member, the leader
//! itself, a voter that is down, and when sent to a learner. A job runs through every move on
//! its first attempt, and writes go on.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_tests::{Cluster, shell_job};
use serde_json::Value;

fn gpuctl(c: &Cluster, via: u64, args: &[&str]) -> (Option<i32>, Value, String) {
    c.gpuctl_json(via, args)
}

/// `line` without its terminal colour codes.
fn plain(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(ch) = chars.next() {
        if ch == '\u{1b}' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            out.push(ch);
        }
    }
    out
}

async fn leader(c: &Cluster, via: u64) -> Option<u64> {
    c.status(via, false).await.ok().and_then(|s| s.leader_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_to_a_voter_on_request_and_nowhere_else() {
    let mut c = Cluster::start(4, 3, "").await;
    let voters = gpu_tests::voters(&c.status(1, false).await.expect("status"));
    let learner = (1..=4).find(|id| !voters.contains(id)).expect("a learner");
    let followers: Vec<u64> = voters.iter().copied().filter(|id| *id != 1).collect();
    let job = c
        .submit(1, shell_job("through-the-moves", 1, "sleep 12"), "moves")
        .await
        .expect("submit")
        .job_id;

    // Refusals change nothing.
    let to = |id: u64| id.to_string();
    for (args, why) in [
        (vec!["--to".to_owned(), to(learner)], "is a learner"),
        (vec!["--to".to_owned(), "9".to_owned()], "not a member"),
        (vec!["--to".to_owned(), "1".to_owned()], "leads already"),
    ] {
        let mut all = vec!["cluster", "transfer-leader"];
        all.extend(args.iter().map(String::as_str));
        let (code, _, err) = gpuctl(&c, followers[0], &all);
        assert_eq!(code, Some(2), "{all:?}: {err}");
        assert!(err.contains(why), "{all:?}: {err}");
    }
    let (code, _, err) = gpuctl(&c, learner, &["cluster", "transfer-leader"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("send this to a voter"), "{err}");
    // A voter that is down.
    let down = followers[1];
    c.kill(down);
    c.wait_for(
        "the leader to miss the stopped voter",
        Duration::from_secs(20),
        |c| async move {
            c.status(1, false).await.is_ok_and(|s| {
                s.members
                    .iter()
                    .any(|m| m.node_id == down && m.reachable == Some(false))
            })
        },
    )
    .await;
    let (code, _, err) = gpuctl(&c, 1, &["cluster", "transfer-leader", "--to", &to(down)]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("has not answered"), "{err}");
    assert_eq!(leader(&c, 1).await, Some(1), "nothing changed");
    c.start_agent(down);
    c.wait_for("the voter back", Duration::from_secs(30), |c| async move {
        c.status(1, false)
            .await
            .is_ok_and(|s| s.members.iter().all(|m| m.reachable == Some(true)))
    })
    .await;

    // To a named voter, asked through another voter. A planned move logs no ERROR: nothing
    // in it needs a human.
    let logged: Vec<usize> = (1..=4).map(|id| c.log_of(id).len()).collect();
    let next = followers[0];
    let (code, moved, err) = gpuctl(&c, down, &["cluster", "transfer-leader", "--to", &to(next)]);
    assert_eq!(code, Some(0), "{err}\n{}", c.logs());
    assert_eq!(moved["from"], 1, "{moved}");
    assert_eq!(moved["leader"], next, "{moved}");
    assert_eq!(leader(&c, learner).await, Some(next));
    // To the best voter, asked of the leader itself.
    let (code, moved, err) = gpuctl(&c, next, &["cluster", "transfer-leader"]);
    assert_eq!(code, Some(0), "{err}");
    let now = moved["leader"].as_u64().expect("a leader");
    assert!(now != next && voters.contains(&now), "{moved}");
    // `--from` a voter that does not lead: nothing moves.
    let (code, stays, err) = gpuctl(
        &c,
        now,
        &["cluster", "transfer-leader", "--from", &to(next)],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        (stays["from"].as_u64(), stays["leader"].as_u64()),
        (Some(now), Some(now))
    );

    // A planned restart of the former leader, as the upgrade procedure does it: it says it is
    // ready only once caught up, and no agent logs an ERROR for it.
    let commit = c.status(now, false).await.expect("status").commit_index;
    let restarted_at = c.log_of(1).len();
    c.terminate(1);
    let mut stopped = None;
    for _ in 0..200 {
        stopped = c.exited(1);
        if stopped.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        stopped.is_some_and(|s| s.success()),
        "n1 stops cleanly: {stopped:?}"
    );
    c.start_agent(1);
    c.wait_for("n1 ready again", Duration::from_secs(30), |c| {
        let log = c.log_of(1);
        async move {
            log.get(restarted_at..)
                .is_some_and(|l| l.contains("agent ready"))
        }
    })
    .await;
    let log = c.log_of(1);
    let ready = log[restarted_at..]
        .lines()
        .find(|l| l.contains("agent ready"))
        .expect("the ready line");
    let index: u64 = plain(ready)
        .split("log_index=")
        .nth(1)
        .map(|r| {
            r.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no log index in {ready:?}"));
    assert!(
        index >= commit,
        "ready at {index}, before the cluster's {commit}: {ready}"
    );

    let errors: Vec<String> = (1..=4)
        .flat_map(|id| {
            let log = c.log_of(id);
            let since = log.get(logged[id as usize - 1]..).unwrap_or("").to_owned();
            since
                .lines()
                .filter(|l| plain(l).split_whitespace().nth(1) == Some("ERROR"))
                .map(|l| format!("n{id}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        errors.is_empty(),
        "ERROR lines during planned moves and a restart:\n{}",
        errors.join("\n")
    );

    // The job ran through it on its first attempt; writes go on; the moves are audited.
    let done = c
        .wait_job(job, Duration::from_secs(60), gpu_tests::is_terminal)
        .await;
    assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?}");
    assert_eq!(done.runs.len(), 1, "{done:?}");
    c.submit(learner, shell_job("after", 0, "true"), "after")
        .await
        .expect("a write after the moves");
    let (_, audit, _) = gpuctl(&c, now, &["audit", "list"]);
    let moves = audit
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["verb"] == "cluster.transfer-leader")
        .count();
    assert!(
        moves >= 6,
        "every request audited, refused ones included: {audit}"
    );
}
