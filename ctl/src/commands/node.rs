//! `gpuctl node list|get|label|cordon|uncordon|drain|remove`.
//!
//! JSON (stable): a node is `{"id", "addr", "status" ("ready"|"down"|"unknown"), "cordoned",
//! "labels": {k: v}, "cpu_cores", "memory_mib", "gpus": [GPU], "registered_at_ms",
//! "updated_at_ms", "edge", "images"}` (`edge`: null, or `{"site", "lease_ms", "down_after_ms"}`
//! for a node at an edge site: a learner only, fenced and judged down by its site's terms;
//! `images`: the container images its runtime holds, canonical names, sorted) with each GPU
//! `{"index", "uuid", "model", "gpu_type", "memory_mib",
//! "numa_node" (null when unknown), "nvlink_peers": [index], "healthy", "job_id" (null when no
//! job holds it)}`. `list` prints an array of nodes; `remove` prints `{"removed", "revoked":
//! [serial]}`; every other verb prints the node as it is after the call.

use std::collections::BTreeMap;

use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;
use gpu_proto::v1::node_service_client::NodeServiceClient;
use serde_json::{Value, json};

use super::{Answer, Ctx, Failure, gpu_view};
use crate::cli::NodeVerb;
use crate::output::{table, table_of};
use crate::units;

pub(crate) async fn run(ctx: &Ctx, verb: NodeVerb) -> Result<Answer, Failure> {
    let new = NodeServiceClient::new;
    let node = match verb {
        NodeVerb::List { stale } => {
            let req = pb::ListNodesRequest { stale };
            let nodes = ctx
                .call(new, req, async |mut c, r| c.list_nodes(r).await)
                .await?
                .nodes;
            return Ok(ctx.answer_list(&nodes, node_json, nodes_table));
        }
        NodeVerb::Get { id, stale } => {
            let req = pb::GetNodeRequest { id, stale };
            ctx.call(new, req, async |mut c, r| c.get_node(r).await)
                .await?
        }
        NodeVerb::Label { id, changes } => {
            let req = label_request(id, &changes).map_err(Failure::Usage)?;
            ctx.call(new, req, async |mut c, r| c.label_node(r).await)
                .await?
        }
        NodeVerb::Remove { id } => {
            let req = pb::RemoveNodeRequest { id };
            let removed = ctx
                .call(new, req, async |mut c, r| c.remove_node(r).await)
                .await?;
            return Ok(ctx.answer(
                || serde_json::json!({"removed": id, "revoked": removed.revoked}),
                || {
                    format!(
                        "removed n{id}; revoked {} certificate(s)\n",
                        removed.revoked.len()
                    )
                },
            ));
        }
        NodeVerb::Cordon { id } => cordon(ctx, id, true).await?,
        NodeVerb::Uncordon { id } => cordon(ctx, id, false).await?,
        NodeVerb::Drain { id, evict, wait } => {
            let req = pb::DrainNodeRequest { id, evict };
            let node = ctx
                .call(new, req, async |mut c, r| c.drain_node(r).await)
                .await?;
            if wait {
                until_no_job_runs_on(ctx, id).await?;
            }
            node
        }
    };
    Ok(ctx.answer(|| node_json(&node), || node_detail(&node)))
}

/// Poll until no job is bound to or running on node `id` (within `--timeout`, if given).
async fn until_no_job_runs_on(ctx: &Ctx, id: u64) -> Result<(), Failure> {
    let deadline = ctx.timeout.map(|t| std::time::Instant::now() + t);
    loop {
        let req = pb::ListJobsRequest {
            states: vec![pb::JobState::Bound as i32, pb::JobState::Running as i32],
            node_id: Some(id),
            ..Default::default()
        };
        let left = ctx
            .call(JobServiceClient::new, req, async |mut c, r| {
                c.list_jobs(r).await
            })
            .await?
            .jobs
            .len();
        if left == 0 {
            return Ok(());
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            return Err(Failure::TimedOut(format!(
                "timed out: {left} jobs still on n{id}"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

async fn cordon(ctx: &Ctx, id: u64, cordoned: bool) -> Result<pb::Node, Failure> {
    let req = pb::CordonNodeRequest { id, cordoned };
    let new = NodeServiceClient::new;
    Ok(ctx
        .call(new, req, async |mut c, r| c.cordon_node(r).await)
        .await?)
}

/// `key=value` sets, `key-` removes.
fn label_request(id: u64, changes: &[String]) -> Result<pb::LabelNodeRequest, String> {
    let mut req = pb::LabelNodeRequest {
        id,
        ..Default::default()
    };
    for change in changes {
        if let Some((k, v)) = change.split_once('=') {
            req.set.insert(k.to_owned(), v.to_owned());
        } else if let Some(k) = change.strip_suffix('-') {
            req.remove.push(k.to_owned());
        } else {
            return Err(format!(
                "label change {change:?} must be key=value (set) or key- (remove)"
            ));
        }
    }
    Ok(req)
}

fn status(n: &pb::Node) -> &'static str {
    match pb::NodeStatus::try_from(n.status) {
        Ok(pb::NodeStatus::Ready) => "ready",
        Ok(pb::NodeStatus::Down) => "down",
        _ => "unknown",
    }
}

fn node_json(n: &pb::Node) -> Value {
    let labels: BTreeMap<&String, &String> = n.labels.iter().collect();
    let gpus: Vec<Value> = n
        .gpus
        .iter()
        .map(|g| Value::Object(gpu_view::gpu_json(g)))
        .collect();
    json!({
        "id": n.id,
        "addr": n.addr,
        "status": status(n),
        "cordoned": n.cordoned,
        "labels": labels,
        "cpu_cores": n.cpu_cores,
        "memory_mib": n.memory_mib,
        "gpus": gpus,
        "registered_at_ms": n.registered_at_ms,
        "updated_at_ms": n.updated_at_ms,
        "edge": n.edge.as_ref().map(|e| json!({
            "site": e.site,
            "lease_ms": e.lease_ms,
            "down_after_ms": e.down_after_ms,
        })),
        "images": n.images,
    })
}

/// `Ready`, `Down,cordoned`, …
fn status_cell(n: &pb::Node) -> String {
    let mut s = match status(n) {
        "ready" => "Ready".to_owned(),
        "down" => "Down".to_owned(),
        _ => "Unknown".to_owned(),
    };
    if n.cordoned {
        s.push_str(",cordoned");
    }
    s
}

/// GPUs counted by model: `4xA100-80GB`, `2xA100-80GB,2xH100`, or `-`.
fn gpus_cell(gpus: &[pb::Gpu]) -> String {
    let mut by_model: BTreeMap<&str, usize> = BTreeMap::new();
    for g in gpus {
        let model = [g.model.as_str(), g.gpu_type.as_str(), "?"]
            .into_iter()
            .find(|m| !m.is_empty())
            .unwrap_or("?");
        *by_model.entry(model).or_default() += 1;
    }
    if by_model.is_empty() {
        return "-".into();
    }
    by_model
        .iter()
        .map(|(model, count)| format!("{count}x{model}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn nodes_table(nodes: &[pb::Node]) -> String {
    table_of(
        &["NODE", "ADDRESS", "STATUS", "GPUS", "FREE", "LABELS"],
        nodes,
        |n| {
            let labels: BTreeMap<&String, &String> = n.labels.iter().collect();
            let labels = labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            let free = n
                .gpus
                .iter()
                .filter(|g| gpu_view::state(g) == "free")
                .count();
            vec![
                format!("n{}", n.id),
                n.addr.clone(),
                status_cell(n),
                gpus_cell(&n.gpus),
                free.to_string(),
                labels,
            ]
        },
    )
}

/// One node's row, then its GPUs one per line.
fn node_detail(n: &pb::Node) -> String {
    let mut out = nodes_table(std::slice::from_ref(n));
    if let Some(e) = &n.edge {
        out.push_str(&format!(
            "edge site {}: learner only, fences its jobs {} after losing contact, down after {}\n",
            e.site,
            units::format_duration(std::time::Duration::from_millis(e.lease_ms)),
            units::format_duration(std::time::Duration::from_millis(e.down_after_ms))
        ));
    }
    if !n.images.is_empty() {
        out.push_str(&format!(
            "images ({}): {}\n",
            n.images.len(),
            n.images.join(", ")
        ));
    }
    if n.gpus.is_empty() {
        return out;
    }
    let rows: Vec<Vec<String>> = n
        .gpus
        .iter()
        .map(|g| {
            vec![
                g.index.to_string(),
                g.model.clone(),
                g.gpu_type.clone(),
                units::gib(g.memory_mib),
                g.numa_node.map_or_else(|| "-".into(), |n| n.to_string()),
                if g.nvlink_peers.is_empty() {
                    "-".into()
                } else {
                    let peers: Vec<String> = g.nvlink_peers.iter().map(u32::to_string).collect();
                    peers.join(",")
                },
                gpu_view::state(g).into(),
                gpu_view::job_cell(g),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&table(
        &[
            "GPU", "MODEL", "TYPE", "MEMORY", "NUMA", "NVLINK", "STATE", "JOB",
        ],
        &rows,
    ));
    out
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;
    use crate::commands::gpu_view::tests::gpu;
    use crate::output;

    fn node(id: u64, status: pb::NodeStatus, cordoned: bool, gpus: Vec<pb::Gpu>) -> pb::Node {
        pb::Node {
            id,
            addr: format!("10.0.0.{id}:7070"),
            labels: [
                ("zone".to_owned(), "a".to_owned()),
                ("rack".to_owned(), "r7".to_owned()),
            ]
            .into_iter()
            .collect(),
            registered_at_ms: 1_700_000_000_000,
            updated_at_ms: 1_700_000_100_000,
            status: status as i32,
            cordoned,
            gpus,
            cpu_cores: 64,
            memory_mib: 512 * 1024,
            edge: None,
            images: vec![],
        }
    }

    fn sample() -> Vec<pb::Node> {
        let mixed = vec![
            gpu(0, Some(42), true),
            gpu(1, None, false),
            pb::Gpu {
                model: "H100".into(),
                ..gpu(2, None, true)
            },
            gpu(3, None, true),
        ];
        vec![
            pb::Node {
                images: vec![
                    "docker.io/library/busybox:latest".into(),
                    "nvcr.io/nvidia/pytorch:24.05-py3".into(),
                ],
                ..node(1, pb::NodeStatus::Ready, false, mixed)
            },
            node(2, pb::NodeStatus::Down, true, vec![]),
            node(
                3,
                pb::NodeStatus::Unspecified,
                true,
                vec![gpu(0, None, true)],
            ),
        ]
    }

    #[test]
    fn label_changes_parse() {
        let req = label_request(3, &["zone=a".into(), "rack-".into()]).expect("valid");
        assert_eq!(req.set.get("zone").map(String::as_str), Some("a"));
        assert_eq!(req.remove, vec!["rack".to_owned()]);
        assert!(label_request(3, &["zone".into()]).is_err());
    }

    #[test]
    fn table_renders() {
        expect![[r#"
            NODE  ADDRESS        STATUS            GPUS                FREE  LABELS
            n1    10.0.0.1:7070  Ready             3xA100-80GB,1xH100  2     rack=r7,zone=a
            n2    10.0.0.2:7070  Down,cordoned     -                   0     rack=r7,zone=a
            n3    10.0.0.3:7070  Unknown,cordoned  1xA100-80GB         1     rack=r7,zone=a
        "#]]
        .assert_eq(&nodes_table(&sample()));
    }

    #[test]
    fn detail_renders() {
        expect![[r#"
            NODE  ADDRESS        STATUS  GPUS                FREE  LABELS
            n1    10.0.0.1:7070  Ready   3xA100-80GB,1xH100  2     rack=r7,zone=a
            images (2): docker.io/library/busybox:latest, nvcr.io/nvidia/pytorch:24.05-py3

            GPU  MODEL      TYPE  MEMORY  NUMA  NVLINK  STATE      JOB
            0    A100-80GB  a100  80 GiB  0     1       busy       j-42
            1    A100-80GB  a100  80 GiB  0     0       unhealthy  -
            2    H100       a100  80 GiB  1     3       free       -
            3    A100-80GB  a100  80 GiB  1     2       free       -
        "#]]
        .assert_eq(&node_detail(&sample()[0]));
    }

    #[test]
    fn json_renders() {
        let nodes = sample();
        // Each GPU is the object of `gpu list` (snapshot in gpu.rs), in the node's order.
        let mut v = node_json(&nodes[0]);
        let gpus: Vec<Value> = nodes[0]
            .gpus
            .iter()
            .map(|g| Value::Object(gpu_view::gpu_json(g)))
            .collect();
        assert_eq!(v["gpus"].take(), Value::Array(gpus));
        expect![[r#"
            {
              "addr": "10.0.0.1:7070",
              "cordoned": false,
              "cpu_cores": 64,
              "edge": null,
              "gpus": null,
              "id": 1,
              "images": [
                "docker.io/library/busybox:latest",
                "nvcr.io/nvidia/pytorch:24.05-py3"
              ],
              "labels": {
                "rack": "r7",
                "zone": "a"
              },
              "memory_mib": 524288,
              "registered_at_ms": 1700000000000,
              "status": "ready",
              "updated_at_ms": 1700000100000
            }
        "#]]
        .assert_eq(&output::json(&v));
        assert_eq!(node_json(&nodes[1])["status"], "down");
        assert_eq!(node_json(&nodes[1])["gpus"], json!([]));
        let mut edge = nodes[1].clone();
        edge.edge = Some(pb::EdgeSite {
            site: "edge-1".into(),
            lease_ms: 600_000,
            down_after_ms: 900_000,
        });
        assert_eq!(
            node_json(&edge)["edge"],
            json!({"site": "edge-1", "lease_ms": 600_000, "down_after_ms": 900_000})
        );
        let detail = node_detail(&edge);
        assert!(
            detail.contains("edge site edge-1: learner only, fences its jobs 10m after losing contact, down after 15m"),
            "{detail}"
        );
    }
}
