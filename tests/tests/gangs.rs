//! Multi-node gangs with real processes: a job over two nodes is bound all or nothing, each
//! member's process gets the distributed-training environment (the same MASTER_ADDR and
//! MASTER_PORT, WORLD_SIZE, its own RANK and NODE_RANK, LOCAL_RANK) and its own GPUs, and the
//! job succeeds once every member has exited 0; when one member fails, the whole gang fails
//! and the other member's process is stopped.

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_tests::{Cluster, is_terminal, shell_job};

const WAIT: Duration = Duration::from_secs(90);

const PRINT_ENV: &str = "for v in MASTER_ADDR MASTER_PORT WORLD_SIZE RANK NODE_RANK LOCAL_RANK \
     GPUMESH_NODE_ID CUDA_VISIBLE_DEVICES; do eval echo $v=\\$$v; done";

fn gang(name: &str, script: &str) -> pb::JobSpec {
    pb::JobSpec {
        nodes: 2,
        ..shell_job(name, 4, script)
    }
}

/// `KEY=VALUE` lines of a member's stdout.
fn member_env(c: &Cluster, node: u64, job: u64) -> BTreeMap<String, String> {
    let path = c.run_dir(node, job, 1).join("stdout.log");
    let out = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_runs_on_two_nodes_with_the_training_environment_and_fails_as_one() {
    let c = Cluster::start(3, 3, "").await;

    // Phase 1: 2 nodes × 2 GPUs; every member prints its environment and exits 0.
    let id = c
        .submit(1, gang("ddp", PRINT_ENV), "")
        .await
        .expect("submit")
        .job_id;
    let done = c.wait_job(id, WAIT, is_terminal).await;
    assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?}");
    assert_eq!(done.gang_nodes.len(), 2, "{done:?}");
    assert_eq!(done.node_id, done.gang_nodes.first().copied());
    let master_host = c
        .addr(done.gang_nodes[0])
        .rsplit_once(':')
        .map(|(h, _)| h.to_owned())
        .expect("host:port");
    let mut gpus = Vec::new();
    for (rank, node) in done.gang_nodes.iter().enumerate() {
        let env = member_env(&c, *node, id);
        let want = |k: &str| env.get(k).map(String::as_str).unwrap_or("<unset>");
        assert_eq!(want("MASTER_ADDR"), master_host, "n{node}: {env:?}");
        assert_eq!(want("MASTER_PORT"), (29_500 + id % 1000).to_string());
        assert_eq!(want("WORLD_SIZE"), "4");
        assert_eq!(want("NODE_RANK"), rank.to_string());
        assert_eq!(want("RANK"), (rank * 2).to_string());
        assert_eq!(want("LOCAL_RANK"), "0");
        assert_eq!(want("GPUMESH_NODE_ID"), node.to_string());
        let visible = want("CUDA_VISIBLE_DEVICES");
        assert_eq!(visible.split(',').count(), 2, "n{node}: {visible}");
        gpus.push(visible.to_owned());
    }
    assert_ne!(gpus[0], gpus[1], "each member has its own GPUs");

    // Phase 2: rank 1 fails at once, rank 0 would sleep: the gang fails as one and rank 0's
    // process is stopped.
    let id = c
        .submit(
            2,
            gang(
                "breaks",
                "if [ \"$NODE_RANK\" = 1 ]; then exit 3; fi; echo waiting; sleep 600",
            ),
            "",
        )
        .await
        .expect("submit")
        .job_id;
    let failed = c.wait_job(id, WAIT, is_terminal).await;
    assert_eq!(failed.state, pb::JobState::Failed as i32, "{failed:?}");
    assert_eq!(failed.exit_code, Some(3), "{failed:?}");
    let rank0 = failed.gang_nodes[0];
    c.wait_for("rank 0's process to be stopped", WAIT, |c| {
        let stopped = c.run_outcome(rank0, id, 1).is_some();
        async move { stopped }
    })
    .await;
}

/// Topology domains nest (an NVLink domain inside one rack, a rack inside one block): a label
/// that would break it is refused, naming the node it conflicts with, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_that_breaks_the_nesting_of_topology_domains_is_refused() {
    let c = Cluster::start(2, 1, "").await;
    c.label(1, 1, "nvlink-domain", "nv1").await.expect("label");
    c.label(1, 1, "rack", "r1").await.expect("label");
    c.label(2, 2, "nvlink-domain", "nv1")
        .await
        .expect("same domain");
    let refused = c
        .label(2, 2, "rack", "r2")
        .await
        .expect_err("nv1 across two racks");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains(
            "nvlink-domain nv1 would lie in two domains of rack: r2 here and r1 on node n1"
        ) && refused.message().contains("nothing was changed"),
        "{}",
        refused.message()
    );
    let n2 = c.node(1, 2, false).await.expect("n2");
    assert_eq!(n2.labels.get("rack"), None, "the refused label was not set");
    c.label(2, 2, "rack", "r1")
        .await
        .expect("the same rack nests");
}
