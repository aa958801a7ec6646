//! Image locality in placement: a container job goes to a node that already holds its image
//! when one fits as well (or within `Policy::image_locality` GPUs of hole), never at the cost
//! of a bigger hole; gangs too. And the measurement: a deterministic replay of container jobs
//! over nodes with a bounded image cache, counting the pulls with the term and without it
//! (`cargo test -p gpu-agent image_pulls_avoided -- --nocapture` prints the numbers, recorded
//! in docs/scheduling.md).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use gpu_raft_store::container::{ContainerSpec, canonical_image};
use gpu_raft_store::{
    Bind, CONTAINER_RUNTIME_LABEL, ClusterState, Command, GpuRecord, Inventory, JobId, JobSpec,
    JobState, NodeId, Outcome,
};

use super::plan::plan;
use super::testkit::{apply_at, gpu, spec, submit_at};
use super::{PlanEnv, Policy};

/// A node with a container runtime and `gpus` A100s.
fn container_node(s: &mut ClusterState, id: NodeId, gpus: u32) {
    let inventory = Inventory {
        gpus: (0..gpus)
            .map(|i| gpu(i, "A100", 0))
            .collect::<Vec<GpuRecord>>(),
        cpu_cores: 8,
        memory_mib: 1 << 16,
    };
    let labels = BTreeMap::from([(CONTAINER_RUNTIME_LABEL.to_owned(), "podman".to_owned())]);
    apply_at(
        s,
        1,
        Command::RegisterNode {
            node: id,
            addr: format!("h:{id}"),
            labels,
            inventory,
            edge: None,
            protocol: 7,
        },
    );
}

fn holds(s: &mut ClusterState, node: NodeId, images: &[&str]) {
    let images = images.iter().map(|i| canonical_image(i)).collect();
    apply_at(s, 1, Command::ReportImages { node, images });
}

fn container(gpus: u32, image: &str) -> JobSpec {
    JobSpec {
        container: Some(Box::new(ContainerSpec {
            image: image.into(),
            mounts: vec![],
        })),
        ..spec(gpus, 0)
    }
}

fn nodes_of(s: &ClusterState, locality: usize) -> Vec<Bind> {
    let policy = Policy {
        image_locality: locality,
        ..Policy::default()
    };
    plan(s, &policy, &PlanEnv::new(1, &policy)).binds
}

#[test]
fn a_node_holding_the_image_wins_among_equal_fits() {
    let mut s = ClusterState::new();
    for n in 1..=3 {
        container_node(&mut s, n, 4);
    }
    holds(&mut s, 2, &["nvcr.io/nvidia/pytorch:24.05-py3"]);
    holds(&mut s, 3, &["busybox"]);
    submit_at(&mut s, 1, container(4, "nvcr.io/nvidia/pytorch:24.05-py3"));
    submit_at(&mut s, 1, container(2, "busybox:latest"));
    let placed: Vec<(JobId, NodeId)> = nodes_of(&s, 1).iter().map(|b| (b.job, b.node)).collect();
    assert_eq!(placed, [(1, 2), (2, 3)], "each where its image is");
    let without: Vec<(JobId, NodeId)> = nodes_of(&s, 0).iter().map(|b| (b.job, b.node)).collect();
    assert_eq!(without, [(1, 1), (2, 2)], "best fit and node order alone");
}

#[test]
fn packing_still_wins_over_a_bigger_hole() {
    let mut s = ClusterState::new();
    container_node(&mut s, 1, 2);
    container_node(&mut s, 2, 3);
    container_node(&mut s, 3, 4);
    holds(&mut s, 3, &["busybox"]);
    submit_at(&mut s, 1, container(2, "busybox"));
    assert_eq!(
        nodes_of(&s, 1)[0].node,
        1,
        "an exact fit beats the image with a hole of 2"
    );
    assert_eq!(nodes_of(&s, 2)[0].node, 1, "equal cost: the smaller hole");
    assert_eq!(
        nodes_of(&s, 3)[0].node,
        3,
        "a pull worth more than the hole"
    );
    holds(&mut s, 2, &["busybox"]);
    assert_eq!(nodes_of(&s, 2)[0].node, 2, "the image with a hole of 1");
    assert_eq!(nodes_of(&s, 1)[0].node, 1, "equal cost: the smaller hole");
    // A process job is placed as before.
    let mut p = ClusterState::new();
    container_node(&mut p, 1, 4);
    container_node(&mut p, 2, 4);
    holds(&mut p, 2, &["busybox"]);
    submit_at(&mut p, 1, spec(4, 0));
    assert_eq!(nodes_of(&p, 1)[0].node, 1);
}

#[test]
fn a_gang_prefers_the_nodes_holding_its_image() {
    let mut s = ClusterState::new();
    for n in 1..=4 {
        container_node(&mut s, n, 2);
    }
    holds(&mut s, 2, &["localhost/train:1"]);
    holds(&mut s, 4, &["localhost/train:1"]);
    submit_at(
        &mut s,
        1,
        JobSpec {
            nodes: 2,
            ..container(4, "localhost/train:1")
        },
    );
    let mut nodes: Vec<NodeId> = nodes_of(&s, 1).iter().map(|b| b.node).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, [2, 4]);
    let mut without: Vec<NodeId> = nodes_of(&s, 0).iter().map(|b| b.node).collect();
    without.sort_unstable();
    assert_eq!(without, [1, 2]);
}

/// A small seeded generator (xorshift64*), so the replay is the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What one replay measured.
#[derive(Debug, PartialEq, Eq)]
struct Replay {
    jobs: usize,
    pulls: usize,
    /// Job-rounds spent pending (queueing delay), to see what the term costs in packing.
    waited: u64,
    /// Rounds until the last job ended.
    makespan: u64,
}

/// 16 nodes of 8 GPUs, each keeping at most 4 images (least recently used evicted); 600
/// container jobs over 12 images (a few popular ones, a long tail), 1, 2, 4 or 8 GPUs, each
/// running 2 to 9 rounds, 6 arriving per round. A placement on a node without the job's image
/// is a pull, after which the node holds it; the pull takes `pull_rounds`, during which the
/// job holds its GPUs without running.
fn replay(locality: usize, pull_rounds: u64, seed: u64) -> Replay {
    const NODES: u64 = 16;
    const CACHE: usize = 4;
    const JOBS: usize = 600;
    const PER_ROUND: usize = 6;
    let images: Vec<String> = (0..12)
        .map(|i| canonical_image(&format!("registry.example/team/image-{i}:1")))
        .collect();
    let mut rng = Rng(0x5EED_1234_ABCD_0042 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut s = ClusterState::new();
    for n in 1..=NODES {
        container_node(&mut s, n, 8);
    }
    let policy = Policy {
        image_locality: locality,
        ..Policy::default()
    };
    let mut cache: BTreeMap<NodeId, VecDeque<String>> = BTreeMap::new();
    let mut ends: BTreeMap<JobId, u64> = BTreeMap::new();
    let (mut submitted, mut pulls, mut waited) = (0, 0, 0u64);
    let mut round = 0u64;
    while submitted < JOBS || s.jobs.values().any(|j| j.state.is_live()) {
        round += 1;
        let now = round * 1_000;
        for _ in 0..PER_ROUND.min(JOBS - submitted) {
            // Skewed popularity: half the jobs use images 0-2.
            let image = if rng.below(2) == 0 {
                rng.below(3)
            } else {
                rng.below(images.len() as u64)
            };
            let gpus = [1, 1, 2, 2, 4, 8][rng.below(6) as usize];
            submit_at(&mut s, now, container(gpus, &images[image as usize]));
            submitted += 1;
        }
        let binds = plan(&s, &policy, &PlanEnv::new(now, &policy)).binds;
        for b in &binds {
            let image = s.jobs[&b.job]
                .spec
                .container
                .as_ref()
                .map(|c| canonical_image(&c.image))
                .unwrap_or_default();
            let held = cache.entry(b.node).or_default();
            let pulled = !held.contains(&image);
            if let Some(at) = held.iter().position(|i| *i == image) {
                held.remove(at);
            } else {
                pulls += 1;
                if held.len() == CACHE {
                    held.pop_front();
                }
            }
            held.push_back(image);
            let report = held.iter().cloned().collect::<BTreeSet<String>>();
            apply_at(
                &mut s,
                now,
                Command::ReportImages {
                    node: b.node,
                    images: report,
                },
            );
            let pulling = if pulled { pull_rounds } else { 0 };
            ends.insert(b.job, round + 2 + rng.below(8) + pulling);
        }
        apply_at(&mut s, now, Command::BindJobs { binds });
        waited += s
            .jobs
            .values()
            .filter(|j| j.state == JobState::Pending)
            .count() as u64;
        let done: Vec<JobId> = ends
            .iter()
            .filter(|(_, end)| **end <= round)
            .map(|(j, _)| *j)
            .collect();
        for job in done {
            ends.remove(&job);
            let generation = s.jobs[&job].generation;
            apply_at(&mut s, now, Command::JobStarted { job, generation });
            let end = Command::JobFinished {
                job,
                generation,
                outcome: Outcome::Exited { code: 0 },
            };
            apply_at(&mut s, now, end);
        }
        assert!(round < 10_000, "the replay must end");
    }
    Replay {
        jobs: submitted,
        pulls,
        waited,
        makespan: round,
    }
}

/// `replay` over seeds 1..=SEEDS, summed (one replay's queueing is chaotic: a different
/// choice early changes everything after it).
fn replays(locality: usize, pull_rounds: u64) -> Replay {
    const SEEDS: u64 = 10;
    (1..=SEEDS)
        .map(|seed| replay(locality, pull_rounds, seed))
        .fold(
            Replay {
                jobs: 0,
                pulls: 0,
                waited: 0,
                makespan: 0,
            },
            |a, r| Replay {
                jobs: a.jobs + r.jobs,
                pulls: a.pulls + r.pulls,
                waited: a.waited + r.waited,
                makespan: a.makespan + r.makespan,
            },
        )
}

#[test]
fn image_pulls_avoided() {
    let default = super::policy::DEFAULT_IMAGE_LOCALITY;
    for pull_rounds in [0, 1] {
        for locality in 0..=4 {
            println!(
                "pull {pull_rounds} round(s), image locality {locality}: {:?}",
                replays(locality, pull_rounds)
            );
        }
    }
    // A pull that holds the job's GPUs for a round: fewer pulls, and no more queueing.
    let without = replays(0, 1);
    let with = replays(default, 1);
    assert_eq!(with.jobs, without.jobs);
    assert!(
        with.pulls * 100 <= without.pulls * 90,
        "the term must avoid at least 10% of the pulls: {with:?} vs {without:?}"
    );
    assert!(
        with.waited * 100 <= without.waited * 105,
        "and queue no more (within noise): {with:?} vs {without:?}"
    );
}
