//! `gpuctl image pull (--node N | --all) REF`: pre-pull a container image through each node's
//! agent, so that jobs using it start without waiting for the registry.
//!
//! JSON (stable): an array with one object per node asked, `{"node_id", "image" (the canonical
//! name), "result" ("pulled"|"already-present"|"failed"), "error" (why it failed; "")}`. The
//! exit code is 0 when every node holds the image afterwards, 2 otherwise (each failure on
//! stderr as well).

use gpu_proto::v1 as pb;
use gpu_proto::v1::node_service_client::NodeServiceClient;
use serde_json::{Value, json};

use super::{Answer, Ctx, Failure};
use crate::cli::ImageVerb;
use crate::output::table_of;

/// The label an agent sets on its node when a container runtime is installed there.
const RUNTIME_LABEL: &str = "gpumesh.io/container-runtime";

/// How one node's pull went.
struct Pulled {
    node_id: u64,
    image: String,
    result: Result<bool, String>,
}

pub(crate) async fn run(ctx: &Ctx, verb: ImageVerb) -> Result<Answer, Failure> {
    let ImageVerb::Pull { node, all, image } = verb;
    let nodes = match (node, all) {
        (Some(id), false) => vec![id],
        (None, true) => with_runtime(ctx).await?,
        _ => return Err(Failure::Usage("name one --node, or --all".into())),
    };
    if nodes.is_empty() {
        return Err(Failure::Usage(
            "no node has a container runtime (label gpumesh.io/container-runtime)".into(),
        ));
    }
    let pulls = nodes.iter().map(|&node_id| pull(ctx, node_id, &image));
    let results = futures::future::join_all(pulls).await;
    let failed = results.iter().filter(|r| r.result.is_err()).count();
    for r in &results {
        if let Err(e) = &r.result {
            eprintln!("error: n{}: {e}", r.node_id);
        }
    }
    let answer = ctx.answer_list(&results, pulled_json, pulled_table);
    if failed > 0 {
        // The table or JSON still goes to stdout: it says which nodes hold the image.
        crate::output::emit(&answer.text);
        return Err(Failure::Usage(format!(
            "the pull failed on {failed} of {} node(s)",
            results.len()
        )));
    }
    Ok(answer)
}

/// The nodes whose agents found a container runtime, in id order.
async fn with_runtime(ctx: &Ctx) -> Result<Vec<u64>, Failure> {
    let req = pb::ListNodesRequest { stale: false };
    let nodes = ctx
        .call(NodeServiceClient::new, req, async |mut c, r| {
            c.list_nodes(r).await
        })
        .await?
        .nodes;
    let mut ids: Vec<u64> = nodes
        .iter()
        .filter(|n| n.labels.contains_key(RUNTIME_LABEL))
        .map(|n| n.id)
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

async fn pull(ctx: &Ctx, node_id: u64, image: &str) -> Pulled {
    let req = pb::PullImageRequest {
        node_id,
        image: image.to_owned(),
    };
    let reply = ctx
        .call(NodeServiceClient::new, req, async |mut c, r| {
            c.pull_image(r).await
        })
        .await;
    match reply {
        Ok(r) => Pulled {
            node_id,
            image: r.image,
            result: Ok(r.already_present),
        },
        Err(e) => Pulled {
            node_id,
            image: image.to_owned(),
            result: Err(e.to_string()),
        },
    }
}

fn result_name(r: &Pulled) -> &'static str {
    match r.result {
        Ok(true) => "already-present",
        Ok(false) => "pulled",
        Err(_) => "failed",
    }
}

fn pulled_json(r: &Pulled) -> Value {
    json!({
        "node_id": r.node_id,
        "image": r.image,
        "result": result_name(r),
        "error": r.result.as_ref().err().cloned().unwrap_or_default(),
    })
}

fn pulled_table(results: &[Pulled]) -> String {
    table_of(&["NODE", "IMAGE", "RESULT"], results, |r| {
        vec![
            format!("n{}", r.node_id),
            r.image.clone(),
            result_name(r).into(),
        ]
    })
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;
    use crate::output;

    fn sample() -> Vec<Pulled> {
        vec![
            Pulled {
                node_id: 1,
                image: "docker.io/library/busybox:latest".into(),
                result: Ok(false),
            },
            Pulled {
                node_id: 2,
                image: "docker.io/library/busybox:latest".into(),
                result: Ok(true),
            },
            Pulled {
                node_id: 3,
                image: "busybox".into(),
                result: Err("pulling image busybox on node 3: unauthorized".into()),
            },
        ]
    }

    #[test]
    fn results_render() {
        expect![[r#"
            NODE  IMAGE                             RESULT
            n1    docker.io/library/busybox:latest  pulled
            n2    docker.io/library/busybox:latest  already-present
            n3    busybox                           failed
        "#]]
        .assert_eq(&pulled_table(&sample()));
        let json = Value::Array(sample().iter().map(pulled_json).collect());
        expect![[r#"
            [
              {
                "error": "",
                "image": "docker.io/library/busybox:latest",
                "node_id": 1,
                "result": "pulled"
              },
              {
                "error": "",
                "image": "docker.io/library/busybox:latest",
                "node_id": 2,
                "result": "already-present"
              },
              {
                "error": "pulling image busybox on node 3: unauthorized",
                "image": "busybox",
                "node_id": 3,
                "result": "failed"
              }
            ]
        "#]]
        .assert_eq(&output::json(&json));
    }
}
