//! Where a job goes: an index of schedulable nodes bucketed by free GPUs, best fit (the node
//! whose matching free GPUs leave the smallest hole, keeping big holes for big jobs — the
//! fragmentation-aware packing), GPUs inside a node chosen by topology (one NUMA node, then
//! NVLink-connected), and all-or-nothing multi-node gangs when the policy allows them.
//!
//! Image locality: for a container job, a node that would have to pull the job's image counts
//! as leaving `Policy::image_locality` more GPUs idle than it does (on equal cost the smaller
//! hole wins), so among nodes that fit equally well or nearly (by default: a hole at most one
//! GPU bigger) the one already holding the image wins and the job starts without a pull.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use gpu_raft_store::container::canonical_image;
use gpu_raft_store::{
    CONTAINER_RUNTIME_LABEL, ClusterState, GpuRecord, JobSpec, NodeId, TOPOLOGY_LABELS, gpu_fits,
};

/// One schedulable node as a pass sees it.
pub(crate) struct Slot<'a> {
    pub id: NodeId,
    pub labels: Cow<'a, BTreeMap<String, String>>,
    /// Healthy GPUs not held by a live job nor taken earlier in this pass.
    pub free: Vec<&'a GpuRecord>,
    /// Every GPU, healthy or not (what the node could offer once empty and repaired: a job
    /// that needs a GPU that is down waits for it rather than being called impossible).
    pub all: &'a [GpuRecord],
    /// The container images the node holds (canonical names).
    pub images: &'a BTreeSet<String>,
}

/// A placement: node slots with the GPU indexes taken on each. One part, except for gangs.
pub(crate) type Placement = Vec<(usize, Vec<u32>)>;

/// The schedulable nodes of one pass, indexed by their number of free GPUs.
pub(crate) struct Nodes<'a> {
    pub slots: Vec<Slot<'a>>,
    /// `buckets[n]`: slots with exactly `n` free GPUs, in node id order.
    buckets: Vec<BTreeSet<usize>>,
    free_total: usize,
    /// The most GPUs on one node (the largest plain single-node job).
    pub largest_node: usize,
    /// What a pull costs, in GPUs of hole (`Policy::image_locality`; 0: image locality off).
    image_miss: usize,
}

impl<'a> Nodes<'a> {
    pub(super) fn new(state: &'a ClusterState, image_miss: usize) -> Self {
        let slots: Vec<Slot<'a>> = state
            .nodes
            .values()
            .filter(|n| n.accepts_work())
            .map(|n| Slot {
                id: n.id,
                labels: n.effective_labels(),
                free: {
                    let mut free = Vec::with_capacity(n.inventory.gpus.len());
                    free.extend(n.free_gpus());
                    free
                },
                all: &n.inventory.gpus,
                images: &n.images,
            })
            .collect();
        let most = slots.iter().map(|s| s.free.len()).max().unwrap_or(0);
        let mut buckets = vec![BTreeSet::new(); most + 1];
        for (i, s) in slots.iter().enumerate() {
            buckets[s.free.len()].insert(i);
        }
        let free_total = slots.iter().map(|s| s.free.len()).sum();
        let largest_node = slots.iter().map(|s| s.all.len()).max().unwrap_or(0);
        Self {
            slots,
            buckets,
            free_total,
            largest_node,
            image_miss,
        }
    }

    /// The extra cost of placing on slot `i`: `image_miss` when `spec` is a container job
    /// whose image the node lacks (`image`: its canonical name), else 0.
    fn pull_cost(&self, i: usize, image: Option<&String>) -> usize {
        match image {
            Some(image) if !self.slots[i].images.contains(image) => self.image_miss,
            _ => 0,
        }
    }

    /// The most free GPUs on any one node.
    pub(super) fn max_free(&self) -> usize {
        self.buckets
            .iter()
            .rposition(|b| !b.is_empty())
            .unwrap_or(0)
    }

    /// Free GPUs across all schedulable nodes.
    pub(super) fn total_free(&self) -> usize {
        self.free_total
    }

    /// The best placement for `spec` now, on none of the slots `avoid`.
    pub(super) fn find(&self, spec: &JobSpec, gangs: bool, avoid: &[usize]) -> Option<Placement> {
        if spec.nodes > 1 {
            return self.find_even_gang(spec, avoid);
        }
        let want = spec.gpus as usize;
        if want <= self.max_free()
            && let Some(single) = self.find_single(spec, avoid)
        {
            return Some(vec![single]);
        }
        if gangs && want > self.largest_capacity(spec) {
            return self.find_gang(spec, avoid);
        }
        None
    }

    /// `find`, taking the job's GPU types one at a time in its order of preference first.
    /// `prefer` is the types as the job listed them; `spec` may accept fewer of them (its
    /// tenant is at its quota for some) or, listing none, any (no preference then).
    pub(super) fn find_preferring(
        &self,
        spec: &JobSpec,
        prefer: &[String],
        gangs: bool,
        avoid: &[usize],
    ) -> Option<Placement> {
        if prefer.len() > 1 {
            for t in prefer.iter().filter(|t| spec.gpu_types.contains(t)) {
                let only = JobSpec {
                    gpu_types: vec![t.clone()],
                    ..spec.clone()
                };
                if let Some(p) = self.find(&only, gangs, avoid) {
                    return Some(p);
                }
            }
        }
        self.find(spec, gangs, avoid)
    }

    /// A single-node `spec` on slot `i` alone, if it fits there now.
    pub(super) fn place_on(&self, i: usize, spec: &JobSpec) -> Option<Placement> {
        let want = spec.gpus as usize;
        let slot = &self.slots[i];
        let fits = spec.nodes <= 1
            && selector_matches(spec, &slot.labels)
            && matching_free(slot, spec) >= want;
        fits.then(|| vec![(i, self.pick_in(i, spec, want))])
    }

    /// `want` GPUs of slot `slot` that fit `spec`, best placed (NUMA, NVLink).
    fn pick_in(&self, slot: usize, spec: &JobSpec, want: usize) -> Vec<u32> {
        let fitting: Vec<&GpuRecord> = self.slots[slot]
            .free
            .iter()
            .copied()
            .filter(|g| gpu_fits(g, spec))
            .collect();
        pick_gpus(fitting, want)
    }

    /// Best fit on one node: the smallest cost — the hole left (matching free GPUs beyond the
    /// job's) plus the pull cost — then the smallest hole, then fewest free GPUs, then lowest
    /// node id. Buckets are scanned from the smallest hole up, so the first placement
    /// of cost 0 ends the search.
    fn find_single(&self, spec: &JobSpec, avoid: &[usize]) -> Option<(usize, Vec<u32>)> {
        let want = spec.gpus as usize;
        let image = self.image_of(spec);
        // Any free GPU serves it and no node costs a pull: every eligible slot of a bucket
        // leaves the same hole, so the first one found is the best.
        let uniform = image.is_none() && spec.gpu_types.is_empty() && spec.min_gpu_memory_mib == 0;
        let mut best: Option<((usize, usize), usize)> = None; // ((cost, hole), slot)
        'scan: for bucket in self.buckets.iter().skip(want) {
            for &i in bucket {
                if avoid.contains(&i) || !selector_matches(spec, &self.slots[i].labels) {
                    continue;
                }
                if uniform {
                    best = Some(((0, 0), i));
                    break 'scan;
                }
                let matching = matching_free(&self.slots[i], spec);
                if matching < want {
                    continue;
                }
                let hole = matching - want;
                let key = (hole + self.pull_cost(i, image.as_ref()), hole);
                if best.is_none_or(|(k, _)| key < k) {
                    best = Some((key, i));
                    if key.0 == 0 {
                        break 'scan;
                    }
                }
            }
        }
        best.map(|(_, i)| (i, self.pick_in(i, spec, want)))
    }

    /// The canonical name of a container job's image, when image locality is on.
    fn image_of(&self, spec: &JobSpec) -> Option<String> {
        spec.container
            .as_ref()
            .filter(|_| self.image_miss > 0)
            .map(|c| canonical_image(&c.image))
    }

    /// A gang over several nodes, all or nothing: the nodes with the most matching free GPUs
    /// first, so the gang spans as few nodes as possible.
    fn find_gang(&self, spec: &JobSpec, avoid: &[usize]) -> Option<Placement> {
        let mut candidates: Vec<(usize, Vec<&GpuRecord>)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, s)| !avoid.contains(i) && selector_matches(spec, &s.labels))
            .map(|(i, s)| {
                let fitting = s.free.iter().copied().filter(|g| gpu_fits(g, spec));
                (i, fitting.collect::<Vec<_>>())
            })
            .filter(|(_, f)| !f.is_empty())
            .collect();
        candidates.sort_by_key(|(i, f)| (std::cmp::Reverse(f.len()), *i));
        let mut left = spec.gpus as usize;
        let mut parts = Vec::new();
        for (i, fitting) in candidates {
            if left == 0 {
                break;
            }
            let take = left.min(fitting.len());
            parts.push((i, pick_gpus(fitting, take)));
            left -= take;
        }
        (left == 0).then_some(parts)
    }

    /// A gang the job asked for (`--nodes K`): K distinct nodes with `gpus / K` matching free
    /// GPUs each, the tightest fits first (big holes stay for big jobs; a node that must pull
    /// the image counts as its pull cost more), in node id order on ties; member 0 (the rank-0 node) is the first. All or nothing.
    fn find_even_gang(&self, spec: &JobSpec, avoid: &[usize]) -> Option<Placement> {
        let per = spec.gpus_per_node() as usize;
        let k = spec.node_count() as usize;
        let image = self.image_of(spec);
        let mut fits: Vec<((usize, usize), usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, s)| !avoid.contains(i) && selector_matches(spec, &s.labels))
            .map(|(i, s)| (matching_free(s, spec), i))
            .filter(|(m, _)| *m >= per)
            .map(|(m, i)| {
                let hole = m - per;
                ((hole + self.pull_cost(i, image.as_ref()), hole), i)
            })
            .collect();
        if fits.len() < k {
            return None;
        }
        fits.sort_unstable();
        let chosen = self.in_one_domain(&fits, k, spec.topology.as_deref())?;
        Some(
            chosen
                .into_iter()
                .map(|i| (i, self.pick_in(i, spec, per)))
                .collect(),
        )
    }

    /// The K slots of `fits` (cheapest first) a gang goes on: inside the narrowest topology
    /// domain that holds K of them (of those, the cheapest, then the first by name), up to
    /// the level the gang requires; without a requirement, the K cheapest anywhere when no
    /// domain can hold it.
    fn in_one_domain(
        &self,
        fits: &[((usize, usize), usize)],
        k: usize,
        required: Option<&str>,
    ) -> Option<Vec<usize>> {
        let levels = match required {
            Some(level) => levels_up_to(level),
            None => &TOPOLOGY_LABELS[..],
        };
        for level in levels {
            let labelled = fits.iter().map(|fit| (&*self.slots[fit.1].labels, *fit));
            let best = by_domain(level, labelled)
                .into_iter()
                .filter(|(_, members)| members.len() >= k)
                .map(|(name, members)| {
                    let cost: (usize, usize) = members[..k]
                        .iter()
                        .fold((0, 0), |(c, h), ((cost, hole), _)| (c + cost, h + hole));
                    (cost, name, members)
                })
                .min_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            if let Some((.., members)) = best {
                return Some(members[..k].iter().map(|(_, slot)| *slot).collect());
            }
        }
        required
            .is_none()
            .then(|| fits[..k].iter().map(|(_, slot)| *slot).collect())
    }

    /// Eligible nodes with at least `per` matching GPUs, free or not (for a gang's nodes).
    /// With a topology level required, the most in any one domain.
    pub(super) fn nodes_with_capacity(&self, spec: &JobSpec, per: usize) -> usize {
        let able: Vec<(&BTreeMap<String, String>, ())> = self
            .slots
            .iter()
            .filter(|s| selector_matches(spec, &s.labels))
            .filter(|s| s.all.iter().filter(|g| gpu_fits(g, spec)).count() >= per)
            .map(|s| (&*s.labels, ()))
            .collect();
        gang_domains(spec.topology.as_deref(), &able)
            .iter()
            .map(Vec::len)
            .max()
            .unwrap_or(0)
    }

    /// The most GPUs matching `spec` that any one eligible node has, free or not.
    pub(super) fn largest_capacity(&self, spec: &JobSpec) -> usize {
        if is_plain(spec) {
            return self.largest_node;
        }
        self.slots
            .iter()
            .filter(|s| selector_matches(spec, &s.labels))
            .map(|s| s.all.iter().filter(|g| gpu_fits(g, spec)).count())
            .max()
            .unwrap_or(0)
    }

    /// Whether `spec` could be placed on an otherwise empty cluster.
    pub(super) fn could_ever_fit(&self, spec: &JobSpec, gangs: bool) -> bool {
        if spec.nodes > 1 {
            let per = spec.gpus_per_node() as usize;
            return self.nodes_with_capacity(spec, per) >= spec.node_count() as usize;
        }
        let want = spec.gpus as usize;
        let eligible = || {
            self.slots
                .iter()
                .filter(|s| selector_matches(spec, &s.labels))
        };
        if eligible().next().is_none() {
            return false;
        }
        let capacity = |s: &Slot<'_>| s.all.iter().filter(|g| gpu_fits(g, spec)).count();
        if gangs {
            eligible().map(capacity).sum::<usize>() >= want
        } else {
            eligible().map(capacity).max().unwrap_or(0) >= want
        }
    }

    /// Take the GPUs of `placement` out of the free pool.
    pub(super) fn take(&mut self, placement: &Placement) {
        for (i, gpus) in placement {
            let slot = &mut self.slots[*i];
            self.buckets[slot.free.len()].remove(i);
            self.free_total -= slot.free.len();
            slot.free.retain(|g| !gpus.contains(&g.index));
            self.free_total += slot.free.len();
            self.buckets[slot.free.len()].insert(*i);
        }
    }
}

/// The groups of `items` (each with its node's labels) that a gang may be placed in as a
/// whole: all of them without a required topology level; with one, the items of each domain of
/// that level or a narrower one (narrowest first).
pub(crate) fn gang_domains<T: Copy>(
    required: Option<&str>,
    items: &[(&BTreeMap<String, String>, T)],
) -> Vec<Vec<T>> {
    match required {
        None => vec![items.iter().map(|(_, item)| *item).collect()],
        Some(level) => levels_up_to(level)
            .iter()
            .flat_map(|level| by_domain(level, items.iter().copied()).into_values())
            .collect(),
    }
}

/// The topology levels a gang that requires `level` may be placed in: the narrower ones first
/// (domains nest), then `level` itself; none for an unknown level.
fn levels_up_to(level: &str) -> &'static [&'static str] {
    match TOPOLOGY_LABELS.iter().position(|l| *l == level) {
        Some(i) => &TOPOLOGY_LABELS[..=i],
        None => &[],
    }
}

/// `items` grouped by the domain their node is in at topology `level` (the value of the label
/// of that name), in order of domain name; items of nodes without the label are left out.
fn by_domain<'l, T>(
    level: &str,
    items: impl IntoIterator<Item = (&'l BTreeMap<String, String>, T)>,
) -> BTreeMap<&'l str, Vec<T>> {
    let mut out: BTreeMap<&'l str, Vec<T>> = BTreeMap::new();
    for (labels, item) in items {
        if let Some(domain) = labels.get(level) {
            out.entry(domain.as_str()).or_default().push(item);
        }
    }
    out
}

/// No GPU type, memory, node selector or container: any GPU of any node will do.
pub(crate) fn is_plain(spec: &JobSpec) -> bool {
    spec.gpu_types.is_empty()
        && spec.min_gpu_memory_mib == 0
        && spec.node_selector.is_empty()
        && spec.container.is_none()
}

/// How many of `gpus` (indexes on `slot`) could serve `spec`.
pub(crate) fn matching(slot: &Slot<'_>, gpus: &[u32], spec: &JobSpec) -> usize {
    if is_plain(spec) {
        return gpus.len();
    }
    if !selector_matches(spec, &slot.labels) {
        return 0;
    }
    gpus.iter()
        .filter(|g| slot.all.iter().any(|r| r.index == **g && gpu_fits(r, spec)))
        .count()
}

fn matching_free(slot: &Slot<'_>, spec: &JobSpec) -> usize {
    if spec.gpu_types.is_empty() && spec.min_gpu_memory_mib == 0 {
        slot.free.len()
    } else {
        slot.free.iter().filter(|g| gpu_fits(g, spec)).count()
    }
}

/// Whether a node with `labels` may run `spec`: its node selector, and for a container job a
/// container runtime on the node (the label its agent sets).
pub(crate) fn selector_matches(spec: &JobSpec, labels: &BTreeMap<String, String>) -> bool {
    (spec.container.is_none() || labels.contains_key(CONTAINER_RUNTIME_LABEL))
        && spec
            .node_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
}

/// `want` GPUs from `fitting`: from a single NUMA node when one can hold them all (the one with
/// the fewest spare GPUs), else from all of them; among those, NVLink-connected GPUs when the
/// node reports links, else the lowest indexes.
pub(crate) fn pick_gpus(mut fitting: Vec<&GpuRecord>, want: usize) -> Vec<u32> {
    // NUMA groups in NUMA order: the first of the smallest that holds them all.
    fitting.sort_unstable_by_key(|g| (g.numa_node, g.index));
    let group: &[&GpuRecord] = fitting
        .chunk_by(|a, b| a.numa_node == b.numa_node)
        .filter(|group| group.len() >= want)
        .min_by_key(|group| group.len())
        .unwrap_or(&fitting);
    if want > 1 && group.iter().any(|g| !g.nvlink_peers.is_empty()) {
        let mut gpus = nvlink_clique(group, want);
        gpus.sort_unstable();
        return gpus;
    }
    let mut gpus: Vec<u32> = group.iter().map(|g| g.index).collect();
    gpus.sort_unstable();
    gpus.truncate(want);
    gpus
}

/// Grow a set of `want` GPUs greedily: start from the best-connected GPU, then keep adding the
/// GPU with the most NVLink peers already in the set (lowest index on ties).
fn nvlink_clique(group: &[&GpuRecord], want: usize) -> Vec<u32> {
    let links =
        |g: &GpuRecord, set: &[u32]| g.nvlink_peers.iter().filter(|p| set.contains(p)).count();
    let all: Vec<u32> = group.iter().map(|g| g.index).collect();
    let mut chosen: Vec<u32> = Vec::with_capacity(want);
    while chosen.len() < want {
        let reference: &[u32] = if chosen.is_empty() { &all } else { &chosen };
        let next = group
            .iter()
            .filter(|g| !chosen.contains(&g.index))
            .max_by_key(|g| (links(g, reference), std::cmp::Reverse(g.index)));
        match next {
            Some(g) => chosen.push(g.index),
            None => break,
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testkit::gpu;

    #[test]
    fn nvlink_peers_are_kept_together() {
        // 0-1 and 2-3 are NVLink pairs; 1 and 2 are on the same NUMA node as the rest.
        let mut gpus: Vec<GpuRecord> = (0..4).map(|i| gpu(i, "A100", 0)).collect();
        gpus[0].nvlink_peers = vec![1];
        gpus[1].nvlink_peers = vec![0];
        gpus[2].nvlink_peers = vec![3];
        gpus[3].nvlink_peers = vec![2];
        let free: Vec<&GpuRecord> = gpus.iter().skip(1).collect();
        // Free: 1, 2, 3. A pair must be the linked 2-3, not the lowest indexes 1-2.
        assert_eq!(pick_gpus(free, 2), vec![2, 3]);
    }
}
