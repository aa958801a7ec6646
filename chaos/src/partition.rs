//! Network partitions between agents in their namespaces (`netns`): nft rules inside a node's
//! namespace drop every packet to or from the peers it must not reach. The root namespace (the
//! test's clients) stays reachable from every node, so clients can still ask a cut-off node.

use std::collections::BTreeMap;

use gpu_tests::Cluster;

use crate::history::{Phase, Recorder};
use crate::netns::Netns;

/// The nft table this module owns inside each namespace.
const TABLE: &str = "gmchaos";

/// For each node, the peers it cannot reach. Symmetric by construction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cut {
    /// Node → the peers whose packets it drops (both directions).
    pub blocked: BTreeMap<u64, Vec<u64>>,
}

impl Cut {
    /// `node` reaches nobody among `all`, and nobody reaches it.
    pub fn isolate(node: u64, all: &[u64]) -> Cut {
        let others: Vec<u64> = all.iter().copied().filter(|n| *n != node).collect();
        Cut::split(&[node], &others)
    }

    /// Nodes in `a` reach each other but none in `b`, and the other way round.
    pub fn split(a: &[u64], b: &[u64]) -> Cut {
        let mut blocked = BTreeMap::new();
        for n in a {
            blocked.insert(*n, b.to_vec());
        }
        for n in b {
            blocked.insert(*n, a.to_vec());
        }
        Cut { blocked }
    }

    /// A ring over `all` (in that order): each node reaches only its two neighbours, so each
    /// sees a majority of three in five, and no two nodes see the same one.
    pub fn ring(all: &[u64]) -> Cut {
        let n = all.len();
        let mut blocked = BTreeMap::new();
        for (i, node) in all.iter().enumerate() {
            let near = |j: usize| j == i || j == (i + 1) % n || (j + 1) % n == i;
            let far = (0..n).filter(|j| !near(*j)).map(|j| all[j]).collect();
            blocked.insert(*node, far);
        }
        Cut { blocked }
    }

    /// The nft script that drops `node`'s traffic to and from its blocked peers (replacing
    /// whatever this module set before in that namespace).
    pub fn nft_script(&self, net: &Netns, node: u64) -> String {
        let peers = self.blocked.get(&node).map(Vec::as_slice).unwrap_or(&[]);
        let mut script =
            format!("table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n");
        if !peers.is_empty() {
            let set = peers
                .iter()
                .map(|p| net.ip(*p).to_string())
                .collect::<Vec<_>>()
                .join(", ");
            script.push_str(&format!(
                "  chain input {{ type filter hook input priority 0; policy accept; \
                 ip saddr {{ {set} }} drop; }}\n  \
                 chain output {{ type filter hook output priority 0; policy accept; \
                 ip daddr {{ {set} }} drop; }}\n"
            ));
        }
        script.push_str("}\n");
        script
    }

    /// Put the cut in place in every node's namespace (`all`): nodes without blocked peers are
    /// healed.
    pub fn apply(&self, net: &Netns, all: &[u64]) -> anyhow::Result<()> {
        for node in all {
            net.exec(*node, &["nft", "-f", "-"], &self.nft_script(net, *node))?;
        }
        Ok(())
    }
}

/// Remove every partition rule: every node reaches every other again.
pub fn heal(net: &Netns, all: &[u64]) -> anyhow::Result<()> {
    Cut::default().apply(net, all)
}

/// A cluster whose agents run in network namespaces, cut and healed by the nemesis with every
/// step recorded in the history (with the nodes each cut leaves on a minority side).
pub struct Partitioned<'a> {
    net: &'a Netns,
    rec: &'a Recorder,
    /// Every agent of the cluster.
    pub all: Vec<u64>,
}

impl<'a> Partitioned<'a> {
    pub fn new(c: &Cluster, net: &'a Netns, rec: &'a Recorder) -> Self {
        Self {
            net,
            rec,
            all: c.agents.keys().copied().collect(),
        }
    }

    /// Put `cut` in place: `what` is recorded before, `done` after, with `minority`.
    pub fn cut(
        &self,
        cut: &Cut,
        what: String,
        done: String,
        minority: Vec<u64>,
    ) -> anyhow::Result<()> {
        self.rec.nemesis_cut(Phase::Invoke, what, None)?;
        cut.apply(self.net, &self.all)?;
        self.rec.nemesis_cut(Phase::Ok, done, Some(minority))
    }

    /// Remove every cut: `what` is recorded before (leaving nobody on a minority side), `done`
    /// after.
    pub fn heal(&self, what: String, done: String) -> anyhow::Result<()> {
        self.rec
            .nemesis_cut(Phase::Invoke, what, Some(Vec::new()))?;
        heal(self.net, &self.all)?;
        self.rec.nemesis_cut(Phase::Info, done, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isolate_and_split_are_symmetric() {
        let c = Cut::isolate(2, &[1, 2, 3]);
        assert_eq!(c.blocked[&2], vec![1, 3]);
        assert_eq!(
            (c.blocked[&1].clone(), c.blocked[&3].clone()),
            (vec![2], vec![2])
        );
        let s = Cut::split(&[1, 2], &[3, 4, 5]);
        assert_eq!(s.blocked[&4], vec![1, 2]);
        assert_eq!(s.blocked[&1], vec![3, 4, 5]);
    }

    #[test]
    fn a_ring_blocks_all_but_the_neighbours_symmetrically() {
        let r = Cut::ring(&[1, 2, 3, 4, 5]);
        assert_eq!(r.blocked[&1], vec![3, 4]);
        assert_eq!(r.blocked[&3], vec![1, 5]);
        assert_eq!(r.blocked[&5], vec![2, 3]);
        for (n, peers) in &r.blocked {
            assert_eq!(peers.len(), 2, "n{n} reaches itself and two neighbours");
            for p in peers {
                assert!(r.blocked[p].contains(n), "n{n} and n{p} block each other");
            }
        }
    }

    #[test]
    fn a_cut_drops_traffic_between_namespaces_and_heal_restores_it() {
        if let Some(why) = Netns::unavailable() {
            println!("skipping: {why}");
            return;
        }
        let net = Netns::create(3).expect("namespaces");
        // Nothing listens on node 2's port 9: a reachable node is refused at once (RST),
        // a cut-off one hears nothing and times out (exit 124).
        let reaches = |from: u64| {
            let status = std::process::Command::new("ip")
                .args(["netns", "exec", &net.ns(from), "timeout", "2", "bash", "-c"])
                .arg(format!("exec 3<>/dev/tcp/{}/9", net.ip(2)))
                .stderr(std::process::Stdio::null())
                .status()
                .expect("probe");
            status.code() != Some(124)
        };
        assert!(reaches(1) && reaches(3), "before the cut");
        Cut::split(&[1, 2], &[3])
            .apply(&net, &[1, 2, 3])
            .expect("cut");
        assert!(reaches(1), "same side");
        assert!(!reaches(3), "across the cut");
        heal(&net, &[1, 2, 3]).expect("heal");
        assert!(reaches(3), "healed");
    }
}
