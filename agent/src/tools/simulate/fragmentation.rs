//! MIG fragmentation experiment: one seeded mixed-size stream of MIG requests replayed on a
//! pool of A100-80GB GPUs twice, with first-fit packing and with fragmentation-aware packing,
//! under the model's real placement rules (`mig::MigModel::fit`). Instances are carved when a
//! job starts and destroyed when it ends (demand-driven re-slicing of free space).
//!
//! Fragmentation is measured as GPU-hours of free compute slices while some waiting request
//! did not fit anywhere although the pool's free compute slices in total could hold it.

use gpu_raft_store::mig::{self, COMPUTE_SLICES, Instance, MigModel};
use serde::Serialize;

/// How a request picks its GPU and start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Packing {
    /// The first GPU (in index order) where the profile fits, at its lowest valid start.
    FirstFit,
    /// The placement that leaves the most room for the largest profiles: fewest free compute
    /// slices on the GPU after placing (best fit), then the start after which the largest
    /// profile still fits.
    FragmentationAware,
}

/// One request of the workload.
#[derive(Clone, Debug)]
pub struct Request {
    pub arrival_s: u64,
    pub profile: &'static str,
    pub duration_s: u64,
}

/// What one packing achieved.
#[derive(Clone, Debug, Serialize)]
pub struct FragReport {
    pub packing: Packing,
    pub gpus: usize,
    pub jobs: usize,
    pub mean_wait_s: f64,
    pub makespan_s: u64,
    /// Compute-slice utilization over the makespan, 0..1.
    pub utilization: f64,
    /// GPU-hours of free compute while a request waited though the total free compute fit it.
    pub fragmented_gpu_h: f64,
}

const MIX: &[(&str, u32)] = &[
    ("1g.10gb", 40),
    ("2g.20gb", 25),
    ("3g.40gb", 20),
    ("4g.40gb", 10),
    ("7g.80gb", 5),
];

/// A deterministic mixed-size workload of `n` requests (a 64-bit LCG: same seed, same trace).
pub fn workload(n: usize, gpus: usize, seed: u64) -> Vec<Request> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    let mut next = move |m: u64| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) % m
    };
    let total: u32 = MIX.iter().map(|m| m.1).sum();
    // Mean demand ~2.5 compute slices × 65 min; arrivals keep the pool about 95% loaded.
    let gap = (2.5 * 3_900.0 / (gpus as f64 * f64::from(COMPUTE_SLICES) * 0.95)).max(1.0) as u64;
    let mut t = 0;
    (0..n)
        .map(|_| {
            t += next(2 * gap + 1);
            let mut pick = next(u64::from(total)) as u32;
            let profile = MIX
                .iter()
                .find(|(_, w)| {
                    let hit = pick < *w;
                    pick = pick.saturating_sub(*w);
                    hit
                })
                .map_or("1g.10gb", |m| m.0);
            Request {
                arrival_s: t,
                profile,
                duration_s: 600 + next(7_200),
            }
        })
        .collect()
}

fn compute(model: &MigModel, profile: &str) -> u8 {
    model.profile(profile).map_or(0, |p| p.compute_slices)
}

fn free_compute(model: &MigModel, layout: &[Instance]) -> u8 {
    COMPUTE_SLICES.saturating_sub(layout.iter().map(|i| compute(model, &i.profile)).sum())
}

/// Where `profile` goes on `gpus` under `packing`: (GPU, start).
fn place(
    model: &MigModel,
    gpus: &[Vec<Instance>],
    profile: &str,
    packing: Packing,
) -> Option<(usize, u8)> {
    let p = model.profile(profile)?;
    let mut best: Option<((u8, u8), usize, u8)> = None;
    for (g, layout) in gpus.iter().enumerate() {
        for &start in p.starts {
            let mut with = layout.clone();
            with.push(Instance {
                profile: profile.to_owned(),
                start,
            });
            if model.check(&with).is_err() {
                continue;
            }
            if packing == Packing::FirstFit {
                return Some((g, start));
            }
            // Largest compute the GPU can still take after this placement.
            let room = model
                .profiles
                .iter()
                .filter(|q| model.fit(&with, q.name).is_some())
                .map(|q| q.compute_slices)
                .max()
                .unwrap_or(0);
            let key = (free_compute(model, &with), COMPUTE_SLICES - room);
            if best.as_ref().is_none_or(|(k, _, _)| key < *k) {
                best = Some((key, g, start));
            }
        }
    }
    best.map(|(_, g, s)| (g, s))
}

/// Replay `work` on `gpus` A100-80GB GPUs with `packing` (requests in arrival order, each
/// placed as soon as it fits: later small requests may pass a waiting large one).
pub fn replay(work: &[Request], gpus: usize, packing: Packing) -> FragReport {
    let model = mig::model("A100-80GB").expect("A100-80GB has a MIG table");
    let mut layouts: Vec<Vec<Instance>> = vec![Vec::new(); gpus];
    // (end, gpu, start) of running requests.
    let mut running: Vec<(u64, usize, u8)> = Vec::new();
    let mut pending: Vec<usize> = Vec::new();
    let (mut next, mut now, mut wait_sum, mut busy, mut fragmented) = (0, 0u64, 0u64, 0f64, 0f64);
    let mut frag_now = 0u8;
    while next < work.len() || !pending.is_empty() || !running.is_empty() {
        let arrival = work.get(next).map(|r| r.arrival_s);
        let end = running.iter().map(|r| r.0).min();
        let t = match (arrival, end) {
            (Some(a), Some(e)) => a.min(e),
            (Some(a), None) => a,
            (None, Some(e)) => e,
            (None, None) => break,
        };
        let used: u32 = layouts
            .iter()
            .map(|l| u32::from(COMPUTE_SLICES - free_compute(model, l)))
            .sum();
        busy += f64::from(used) * (t - now) as f64;
        fragmented += f64::from(frag_now) * (t - now) as f64;
        now = t;
        running.retain(|&(e, g, s)| {
            if e <= now {
                layouts[g].retain(|i| i.start != s);
            }
            e > now
        });
        while work.get(next).is_some_and(|r| r.arrival_s <= now) {
            pending.push(next);
            next += 1;
        }
        pending.retain(|&i| {
            let r = &work[i];
            match place(model, &layouts, r.profile, packing) {
                Some((g, start)) => {
                    layouts[g].push(Instance {
                        profile: r.profile.to_owned(),
                        start,
                    });
                    running.push((now + r.duration_s, g, start));
                    wait_sum += now - r.arrival_s;
                    false
                }
                None => true,
            }
        });
        let free: u32 = layouts
            .iter()
            .map(|l| u32::from(free_compute(model, l)))
            .sum();
        let stuck = pending
            .iter()
            .any(|&i| u32::from(compute(model, work[i].profile)) <= free);
        frag_now = if stuck {
            u8::try_from(free).unwrap_or(u8::MAX)
        } else {
            0
        };
    }
    let capacity = gpus as f64 * f64::from(COMPUTE_SLICES) * now.max(1) as f64;
    FragReport {
        packing,
        gpus,
        jobs: work.len(),
        mean_wait_s: wait_sum as f64 / work.len().max(1) as f64,
        makespan_s: now,
        utilization: busy / capacity,
        fragmented_gpu_h: fragmented / f64::from(COMPUTE_SLICES) / 3_600.0,
    }
}

/// Both packings on one workload.
pub fn compare(n: usize, gpus: usize, seed: u64) -> Vec<FragReport> {
    let work = workload(n, gpus, seed);
    [Packing::FirstFit, Packing::FragmentationAware]
        .into_iter()
        .map(|p| replay(&work, gpus, p))
        .collect()
}

/// The comparison as a text table.
pub fn table(reports: &[FragReport]) -> String {
    let mut out = format!(
        "{:<20} {:>5} {:>6} {:>12} {:>12} {:>6} {:>15}\n",
        "packing", "gpus", "jobs", "mean wait s", "makespan s", "util", "fragmented GPUh"
    );
    for r in reports {
        let name = match r.packing {
            Packing::FirstFit => "first-fit",
            Packing::FragmentationAware => "fragmentation-aware",
        };
        out.push_str(&format!(
            "{:<20} {:>5} {:>6} {:>12.0} {:>12} {:>5.1}% {:>15.1}\n",
            name,
            r.gpus,
            r.jobs,
            r.mean_wait_s,
            r.makespan_s,
            r.utilization * 100.0,
            r.fragmented_gpu_h
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_is_mixed_and_deterministic() {
        let a = workload(500, 8, 7);
        let b = workload(500, 8, 7);
        assert_eq!(
            a.iter()
                .map(|r| (r.arrival_s, r.profile, r.duration_s))
                .collect::<Vec<_>>(),
            b.iter()
                .map(|r| (r.arrival_s, r.profile, r.duration_s))
                .collect::<Vec<_>>()
        );
        for (p, _) in MIX {
            assert!(
                a.iter().any(|r| r.profile == *p),
                "{p} missing from the mix"
            );
        }
    }

    #[test]
    fn both_packings_finish_every_job_and_awareness_fragments_less() {
        let r = compare(2_000, 8, 42);
        assert!(r.iter().all(|r| r.jobs == 2_000 && r.makespan_s > 0));
        assert!(
            r.iter()
                .all(|r| r.utilization > 0.0 && r.utilization <= 1.0),
            "{r:?}"
        );
        let (first, aware) = (&r[0], &r[1]);
        assert!(
            aware.fragmented_gpu_h < first.fragmented_gpu_h,
            "fragmentation-aware packing should fragment less:\n{}",
            table(&r)
        );
    }

    #[test]
    fn first_fit_takes_the_lowest_gpu_and_start_and_aware_fills_a_started_gpu() {
        let model = mig::model("A100-80GB").expect("table");
        let one = |p: &str, s: u8| Instance {
            profile: p.into(),
            start: s,
        };
        let gpus = vec![Vec::new(), vec![one("3g.40gb", 4)]];
        assert_eq!(
            place(model, &gpus, "1g.10gb", Packing::FirstFit),
            Some((0, 0))
        );
        let (g, _) = place(model, &gpus, "1g.10gb", Packing::FragmentationAware).expect("fits");
        assert_eq!(g, 1, "the empty GPU is kept whole for a 7g request");
    }
}
