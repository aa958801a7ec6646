//! Where nodes sit in the network, as their labels declare it: what gangs are placed inside.

use std::collections::BTreeMap;

use crate::NodeId;

/// The node labels that declare the network topology, narrowest first, each naming the domain
/// the node is in: its NVLink domain (one NVSwitch fabric, such as an NVL72 rack), its rack,
/// its network block (the nodes under one leaf or spine switch). Domains nest: `LabelNode`
/// refuses a label that would break it (`nesting_conflict`).
/// A gang goes inside the narrowest domain that can hold it (Slurm's topology/block, Kueue's
/// topology-aware scheduling), and must when it names a level (`JobSpec::topology`).
pub const TOPOLOGY_LABELS: [&str; 3] = ["nvlink-domain", "rack", "block"];

/// Why node `node` with `labels` would break the nesting of topology domains among `others`
/// (each node's id and labels; `node`'s own entry is skipped): a domain lies inside one domain
/// of each wider level, so two nodes in the same NVLink domain may not sit in different racks
/// or blocks, nor two of one rack in different blocks. `None` when nothing breaks. Levels a
/// node does not declare constrain nothing.
pub fn nesting_conflict(
    node: NodeId,
    labels: &BTreeMap<String, String>,
    others: impl IntoIterator<Item = (NodeId, BTreeMap<String, String>)>,
) -> Option<String> {
    let levels = TOPOLOGY_LABELS;
    others
        .into_iter()
        .filter(|(other, _)| *other != node)
        .find_map(|(other, theirs)| {
            levels.iter().enumerate().find_map(|(i, narrow)| {
                let domain = labels
                    .get(*narrow)
                    .filter(|d| theirs.get(*narrow) == Some(d))?;
                levels[i + 1..].iter().find_map(|wide| {
                    let (here, there) = (labels.get(*wide)?, theirs.get(*wide)?);
                    (here != there).then(|| {
                        format!(
                            "{narrow} {domain} would lie in two domains of {wide}: {here} here and \
                             {there} on node n{other} (a domain lies inside one domain of each \
                             wider level)"
                        )
                    })
                })
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        (pairs.iter())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_domain_may_not_span_two_wider_domains() {
        let others = || {
            vec![
                (
                    1,
                    labels(&[("nvlink-domain", "nv1"), ("rack", "r1"), ("block", "b1")]),
                ),
                (2, labels(&[("rack", "r2"), ("block", "b1")])),
            ]
        };
        let check = |node, pairs: &[(&str, &str)]| nesting_conflict(node, &labels(pairs), others());
        // Nested, partly declared, or the node's own old labels: fine.
        assert_eq!(check(3, &[("nvlink-domain", "nv1"), ("rack", "r1")]), None);
        assert_eq!(check(3, &[("nvlink-domain", "nv1")]), None);
        assert_eq!(check(3, &[("rack", "r2"), ("block", "b1")]), None);
        assert_eq!(check(1, &[("nvlink-domain", "nv1"), ("rack", "r9")]), None);
        // An NVLink domain across racks, a rack across blocks.
        let across = check(3, &[("nvlink-domain", "nv1"), ("rack", "r2")]).expect("a conflict");
        assert_eq!(
            across,
            "nvlink-domain nv1 would lie in two domains of rack: r2 here and r1 on node n1 (a \
             domain lies inside one domain of each wider level)"
        );
        let across = check(3, &[("rack", "r2"), ("block", "b7")]).expect("a conflict");
        assert!(
            across.starts_with(
                "rack r2 would lie in two domains of block: b7 here and b1 on node n2"
            ),
            "{across}"
        );
        // Skipping a level still nests: an NVLink domain in two blocks.
        let across = check(3, &[("nvlink-domain", "nv1"), ("block", "b2")]).expect("a conflict");
        assert!(across.contains("two domains of block"), "{across}");
    }
}
