//! `gpuctl node list|get|label`.
//!
//! JSON (stable): a node is `{"id", "addr", "labels": {k: v}, "registered_at_ms",
//! "updated_at_ms"}`; `list` prints an array of them.

use std::collections::BTreeMap;

use gpu_proto::v1 as pb;
use gpu_proto::v1::node_service_client::NodeServiceClient;
use serde_json::{Value, json};

use super::{Answer, Ctx, Failure};
use crate::cli::{NodeVerb, Output};
use crate::output::{self, table};

pub async fn run(ctx: &Ctx, verb: NodeVerb) -> Result<Answer, Failure> {
    let nodes = match verb {
        NodeVerb::List { stale } => {
            ctx.endpoints
                .call(|ch| async move {
                    Ok(NodeServiceClient::new(ch)
                        .list_nodes(pb::ListNodesRequest { stale })
                        .await?
                        .into_inner()
                        .nodes)
                })
                .await?
        }
        NodeVerb::Get { id, stale } => {
            let node = ctx
                .endpoints
                .call(|ch| async move {
                    Ok(NodeServiceClient::new(ch)
                        .get_node(pb::GetNodeRequest { id, stale })
                        .await?
                        .into_inner())
                })
                .await?;
            return Ok(render_one(ctx, &node));
        }
        NodeVerb::Label { id, changes } => {
            let req = label_request(id, &changes).map_err(Failure::Usage)?;
            let node = ctx
                .endpoints
                .call(|ch| {
                    let req = req.clone();
                    async move {
                        Ok(NodeServiceClient::new(ch)
                            .label_node(req)
                            .await?
                            .into_inner())
                    }
                })
                .await?;
            return Ok(render_one(ctx, &node));
        }
    };
    let text = match ctx.output {
        Output::Json => output::json(&Value::Array(nodes.iter().map(node_json).collect())),
        Output::Table => nodes_table(&nodes),
    };
    Ok(Answer {
        text,
        positive: true,
    })
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

fn render_one(ctx: &Ctx, node: &pb::Node) -> Answer {
    let text = match ctx.output {
        Output::Json => output::json(&node_json(node)),
        Output::Table => nodes_table(std::slice::from_ref(node)),
    };
    Answer {
        text,
        positive: true,
    }
}

fn node_json(n: &pb::Node) -> Value {
    let labels: BTreeMap<&String, &String> = n.labels.iter().collect();
    json!({
        "id": n.id,
        "addr": n.addr,
        "labels": labels,
        "registered_at_ms": n.registered_at_ms,
        "updated_at_ms": n.updated_at_ms,
    })
}

fn nodes_table(nodes: &[pb::Node]) -> String {
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            let labels: BTreeMap<&String, &String> = n.labels.iter().collect();
            let labels = labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            vec![format!("n{}", n.id), n.addr.clone(), labels]
        })
        .collect();
    table(&["NODE", "ADDRESS", "LABELS"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_changes_parse() {
        let req = label_request(3, &["zone=a".into(), "rack-".into()]).expect("valid");
        assert_eq!(req.set.get("zone").map(String::as_str), Some("a"));
        assert_eq!(req.remove, vec!["rack".to_owned()]);
        assert!(label_request(3, &["zone".into()]).is_err());
    }
}
