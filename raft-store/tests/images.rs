//! The images a node holds, through `ClusterState::apply`, and the canonical names they are
//! compared by: a node's report replaces its last one; a bad report (unknown node, too many,
//! a name not in canonical form) changes nothing; only the node itself may report them; only
//! protocol 7 agents read them.

use std::collections::BTreeSet;

use gpu_raft_store::container::{MAX_NODE_IMAGES, canonical_image};
use gpu_raft_store::testing::{at, register};
use gpu_raft_store::{ApplyResult, ClusterState, Command, PROTOCOL_7, Rejection};

fn report(node: u64, images: &[&str]) -> Command {
    Command::ReportImages {
        node,
        images: images.iter().map(|i| (*i).to_owned()).collect(),
    }
}

#[test]
fn canonical_names_make_a_jobs_reference_and_a_nodes_listing_compare() {
    for (given, canonical) in [
        ("busybox", "docker.io/library/busybox:latest"),
        ("busybox:1.36", "docker.io/library/busybox:1.36"),
        (
            "nvidia/cuda:12.4.0-base",
            "docker.io/nvidia/cuda:12.4.0-base",
        ),
        (
            "nvcr.io/nvidia/pytorch:24.05-py3",
            "nvcr.io/nvidia/pytorch:24.05-py3",
        ),
        ("localhost/gpumesh-test:1", "localhost/gpumesh-test:1"),
        ("localhost:5000/team/img", "localhost:5000/team/img:latest"),
        (
            "busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "docker.io/library/busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000",
        ),
    ] {
        assert_eq!(canonical_image(given), canonical, "{given}");
        assert_eq!(canonical_image(canonical), canonical, "stable: {canonical}");
    }
}

#[test]
fn a_nodes_report_replaces_the_last_and_a_bad_one_changes_nothing() {
    let mut s = ClusterState::new();
    s.apply(&at(1, register(1, vec![])));
    let first = report(1, &["localhost/a:1", "docker.io/library/busybox:latest"]);
    assert_eq!(s.apply(&at(2, first)), ApplyResult::Ok);
    assert_eq!(s.nodes[&1].images.len(), 2);
    assert_eq!(
        s.apply(&at(3, report(1, &["localhost/b:1"]))),
        ApplyResult::Ok
    );
    let held: Vec<&str> = s.nodes[&1].images.iter().map(String::as_str).collect();
    assert_eq!(held, ["localhost/b:1"], "replaced, not added to");

    let before = s.nodes.clone();
    let too_many: BTreeSet<String> = (0..=MAX_NODE_IMAGES)
        .map(|i| format!("localhost/img:{i}"))
        .collect();
    for (cmd, says) in [
        (report(1, &["busybox"]), "canonical form"),
        (report(1, &["Not/Valid"]), "not a valid reference"),
        (
            Command::ReportImages {
                node: 1,
                images: too_many,
            },
            "at most 256 images",
        ),
    ] {
        match s.apply(&at(4, cmd)) {
            ApplyResult::Rejected {
                reason: Rejection::Invalid { message },
            } => assert!(message.contains(says), "{message}"),
            other => panic!("{says}: {other:?}"),
        }
        assert_eq!(s.nodes, before, "untouched");
    }
    assert_eq!(
        s.apply(&at(5, report(9, &["localhost/b:1"]))),
        ApplyResult::Rejected {
            reason: Rejection::UnknownNode { node: 9 }
        }
    );
}

#[test]
fn only_the_node_itself_reports_its_images_and_only_to_protocol_7_agents() {
    let mut s = ClusterState::new();
    s.apply(&at(1, register(1, vec![])));
    s.apply(&at(1, register(2, vec![])));
    let mine = report(1, &["localhost/a:1"]);
    assert!(s.is_own_report(1, &mine));
    assert!(!s.is_own_report(2, &mine), "n2 cannot speak for n1");
    assert_eq!(mine.protocol(), PROTOCOL_7);
    assert_eq!(mine.to_string(), "images n1: 1");
}
