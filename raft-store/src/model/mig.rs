//! MIG (Multi-Instance GPU) rules: each MIG-capable model's GPU-instance profiles with their
//! allowed placements, and the one check of a layout. Pure; `apply`, the scheduler, the
//! simulated backend and the NVML backend all use these tables.
//!
//! A MIG-capable GPU has 8 memory slices and 7 compute slices. A GPU instance of a profile
//! occupies `memory_slices` consecutive memory slices starting at one of the profile's allowed
//! starts (NVML's `nvmlGpuInstancePlacement_t { start, size }`, what `nvidia-smi mig -lgipp`
//! prints) and `compute_slices` compute slices. A layout is valid iff every instance sits on an
//! allowed placement of its profile, no two instances share a memory slice, the compute slices
//! add up to at most 7, and no profile appears more often than the model allows (the `+me`
//! media-extension profiles: once). Source: NVIDIA's MIG user guide, "Supported MIG Profiles"
//! (A100-SXM4-40GB, A100-SXM4-80GB, H100-SXM5-80GB, H200-SXM5-141GB). Memory is nominal:
//! `memory_slices / 8` of the GPU's memory (the driver reports a little less).

use serde::{Deserialize, Serialize};

/// Memory slices of every MIG-capable GPU modelled here.
pub const MEMORY_SLICES: u8 = 8;
/// Compute slices (GPCs available to MIG) of every MIG-capable GPU modelled here.
pub const COMPUTE_SLICES: u8 = 7;

/// One GPU-instance profile of one model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Profile {
    /// `1g.10gb`, `3g.40gb`, `1g.10gb+me`.
    pub name: &'static str,
    pub compute_slices: u8,
    pub memory_slices: u8,
    /// The memory slices an instance of this profile may start at.
    pub starts: &'static [u8],
    /// The most instances of this profile one GPU can hold.
    pub max_instances: u8,
    /// NVML's GPU-instance profile index (`NVML_GPU_INSTANCE_PROFILE_*`).
    pub nvml_profile: u32,
}

/// The MIG profile table of one GPU model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigModel {
    /// The model name as the inventory reports it (`GpuRecord::model`).
    pub model: &'static str,
    pub profiles: &'static [Profile],
}

const SEVEN: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const EVEN4: &[u8] = &[0, 2, 4, 6];
const EVEN3: &[u8] = &[0, 2, 4];
const HALVES: &[u8] = &[0, 4];
const FIRST: &[u8] = &[0];

// NVML_GPU_INSTANCE_PROFILE_* indexes.
const P1: u32 = 0;
const P2: u32 = 1;
const P3: u32 = 2;
const P4: u32 = 3;
const P7: u32 = 4;
const P1_REV1: u32 = 7; // 1 slice with media extensions
const P1_REV2: u32 = 9; // 1 compute slice, 2 memory slices

const fn prof(
    name: &'static str,
    compute_slices: u8,
    memory_slices: u8,
    starts: &'static [u8],
    max_instances: u8,
    nvml_profile: u32,
) -> Profile {
    Profile {
        name,
        compute_slices,
        memory_slices,
        starts,
        max_instances,
        nvml_profile,
    }
}

/// The same geometry on every model; only the memory in the names differs.
const fn table(names: [&'static str; 7]) -> [Profile; 7] {
    [
        prof(names[0], 1, 1, SEVEN, 7, P1),
        prof(names[1], 1, 1, SEVEN, 1, P1_REV1),
        prof(names[2], 1, 2, EVEN4, 4, P1_REV2),
        prof(names[3], 2, 2, EVEN3, 3, P2),
        prof(names[4], 3, 4, HALVES, 2, P3),
        prof(names[5], 4, 4, FIRST, 1, P4),
        prof(names[6], 7, 8, FIRST, 1, P7),
    ]
}

const A100_40: [Profile; 7] = table([
    "1g.5gb",
    "1g.5gb+me",
    "1g.10gb",
    "2g.10gb",
    "3g.20gb",
    "4g.20gb",
    "7g.40gb",
]);
const GB80: [Profile; 7] = table([
    "1g.10gb",
    "1g.10gb+me",
    "1g.20gb",
    "2g.20gb",
    "3g.40gb",
    "4g.40gb",
    "7g.80gb",
]);
const H200: [Profile; 7] = table([
    "1g.18gb",
    "1g.18gb+me",
    "1g.35gb",
    "2g.35gb",
    "3g.71gb",
    "4g.71gb",
    "7g.141gb",
]);

/// Every MIG-capable model gpumesh knows.
pub const MODELS: &[MigModel] = &[
    MigModel {
        model: "A100-40GB",
        profiles: &A100_40,
    },
    MigModel {
        model: "A100-80GB",
        profiles: &GB80,
    },
    MigModel {
        model: "H100-80GB",
        profiles: &GB80,
    },
    MigModel {
        model: "H200-141GB",
        profiles: &H200,
    },
];

/// One GPU instance in a layout: a profile at a start slice.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Instance {
    pub profile: String,
    pub start: u8,
}

impl std::fmt::Display for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.profile, self.start)
    }
}

/// The MIG table of `model`, if it is MIG-capable.
pub fn model(model: &str) -> Option<&'static MigModel> {
    MODELS.iter().find(|m| m.model == model)
}

impl MigModel {
    pub fn profile(&self, name: &str) -> Option<&'static Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// A profile's nominal memory on a GPU with `gpu_memory_mib`.
    pub fn memory_mib(profile: &Profile, gpu_memory_mib: u64) -> u64 {
        gpu_memory_mib / u64::from(MEMORY_SLICES) * u64::from(profile.memory_slices)
    }

    /// Check a whole layout against this model's rules.
    pub fn check(&self, layout: &[Instance]) -> Result<(), String> {
        let mut memory = [false; MEMORY_SLICES as usize];
        let mut compute = 0u8;
        let mut counts = std::collections::BTreeMap::<&str, u8>::new();
        for i in layout {
            let p = self.profile(&i.profile).ok_or_else(|| {
                format!(
                    "{} does not support MIG profile {} (it supports {})",
                    self.model,
                    i.profile,
                    self.names().join(", ")
                )
            })?;
            if !p.starts.contains(&i.start) {
                return Err(format!(
                    "MIG profile {} on {} may start at memory slice {:?}, not {}",
                    p.name, self.model, p.starts, i.start
                ));
            }
            let n = counts.entry(p.name).or_insert(0);
            *n += 1;
            if *n > p.max_instances {
                return Err(format!(
                    "{} holds at most {} instance(s) of {}",
                    self.model, p.max_instances, p.name
                ));
            }
            for s in i.start..i.start + p.memory_slices {
                let slot = memory
                    .get_mut(usize::from(s))
                    .ok_or_else(|| format!("{i} runs past the last memory slice"))?;
                if *slot {
                    return Err(format!("{i} overlaps another instance at memory slice {s}"));
                }
                *slot = true;
            }
            compute += p.compute_slices;
            if compute > COMPUTE_SLICES {
                return Err(format!(
                    "the layout needs more than {COMPUTE_SLICES} compute slices"
                ));
            }
        }
        Ok(())
    }

    /// Where a new instance of `profile` could go in `layout` (the lowest valid start), if
    /// anywhere.
    pub fn fit(&self, layout: &[Instance], profile: &str) -> Option<u8> {
        let p = self.profile(profile)?;
        p.starts.iter().copied().find(|&start| {
            let mut with = layout.to_vec();
            with.push(Instance {
                profile: profile.to_owned(),
                start,
            });
            self.check(&with).is_ok()
        })
    }

    /// A layout from `profile` or `profile@start` entries, in order: an entry without a start
    /// goes at the lowest start where it fits beside the ones before it. Checked whole.
    pub fn parse_layout(&self, entries: &[String]) -> Result<Vec<Instance>, String> {
        let mut layout: Vec<Instance> = Vec::new();
        for e in entries {
            let instance = match e.split_once('@') {
                Some((profile, start)) => Instance {
                    profile: profile.to_owned(),
                    start: start
                        .parse()
                        .map_err(|_| format!("bad MIG start slice in {e:?}"))?,
                },
                None => {
                    self.profile(e).ok_or_else(|| {
                        format!(
                            "{} does not support MIG profile {e} (it supports {})",
                            self.model,
                            self.names().join(", ")
                        )
                    })?;
                    let start = self.fit(&layout, e).ok_or_else(|| {
                        format!("no room left for {e} after {} instance(s)", layout.len())
                    })?;
                    Instance {
                        profile: e.clone(),
                        start,
                    }
                }
            };
            layout.push(instance);
        }
        self.check(&layout)?;
        Ok(layout)
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.profiles.iter().map(|p| p.name).collect()
    }
}

/// Models whose table has `profile`.
pub fn models_supporting(profile: &str) -> Vec<&'static str> {
    MODELS
        .iter()
        .filter(|m| m.profile(profile).is_some())
        .map(|m| m.model)
        .collect()
}

/// A profile name some known model supports (the context-free check at submission).
pub fn known_profile(profile: &str) -> Result<(), String> {
    if models_supporting(profile).is_empty() {
        let mut all: Vec<&str> = MODELS.iter().flat_map(|m| m.names()).collect();
        all.sort_unstable();
        all.dedup();
        return Err(format!(
            "unknown MIG profile {profile:?}: no GPU model supports it (known: {})",
            all.join(", ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn layout(items: &[(&str, u8)]) -> Vec<Instance> {
        items
            .iter()
            .map(|(p, s)| Instance {
                profile: (*p).to_owned(),
                start: *s,
            })
            .collect()
    }

    fn a100() -> &'static MigModel {
        model("A100-80GB").expect("A100-80GB is MIG-capable")
    }

    #[test]
    fn published_layouts_are_valid() {
        let m = a100();
        let seven: Vec<(&str, u8)> = (0..7).map(|s| ("1g.10gb", s)).collect();
        for ok in [
            layout(&seven),
            layout(&[("7g.80gb", 0)]),
            layout(&[("4g.40gb", 0), ("3g.40gb", 4)]),
            layout(&[("3g.40gb", 0), ("3g.40gb", 4)]),
            layout(&[
                ("2g.20gb", 0),
                ("2g.20gb", 2),
                ("2g.20gb", 4),
                ("1g.10gb", 6),
            ]),
            layout(&[
                ("1g.20gb", 0),
                ("1g.20gb", 2),
                ("1g.20gb", 4),
                ("1g.20gb", 6),
            ]),
            layout(&[
                ("3g.40gb", 4),
                ("2g.20gb", 0),
                ("1g.10gb+me", 2),
                ("1g.10gb", 3),
            ]),
            vec![],
        ] {
            assert_eq!(m.check(&ok), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn bad_layouts_say_why() {
        let m = a100();
        let cases = [
            (
                layout(&[("1g.5gb", 0)]),
                "A100-80GB does not support MIG profile 1g.5gb",
            ),
            (
                layout(&[("2g.20gb", 1)]),
                "MIG profile 2g.20gb on A100-80GB may start at memory slice [0, 2, 4], not 1",
            ),
            (
                layout(&[("4g.40gb", 0), ("2g.20gb", 2)]),
                "2g.20gb@2 overlaps another instance at memory slice 2",
            ),
            (
                layout(&[("1g.10gb+me", 0), ("1g.10gb+me", 1)]),
                "A100-80GB holds at most 1 instance(s) of 1g.10gb+me",
            ),
            (
                layout(&[("7g.80gb", 0), ("1g.10gb", 6)]),
                "1g.10gb@6 overlaps another instance at memory slice 6",
            ),
            (
                layout(&[("1g.10gb", 7)]),
                "MIG profile 1g.10gb on A100-80GB may start at memory slice [0, 1, 2, 3, 4, 5, 6], not 7",
            ),
        ];
        for (l, why) in cases {
            let err = m.check(&l).expect_err("invalid");
            assert!(err.starts_with(why), "{l:?}: {err}");
        }
    }

    #[test]
    fn each_model_has_its_own_names() {
        assert_eq!(
            models_supporting("1g.10gb"),
            ["A100-40GB", "A100-80GB", "H100-80GB"]
        );
        assert_eq!(models_supporting("1g.5gb"), ["A100-40GB"]);
        assert_eq!(models_supporting("7g.141gb"), ["H200-141GB"]);
        assert!(model("V100-32GB").is_none());
        assert!(known_profile("3g.71gb").is_ok());
        assert!(known_profile("9g.80gb").is_err());
        let h200 = model("H200-141GB").expect("mig");
        let p = h200.profile("1g.18gb").expect("profile");
        assert_eq!(MigModel::memory_mib(p, 144_384), 18_048);
    }

    #[test]
    fn fit_finds_the_first_free_start() {
        let m = a100();
        assert_eq!(m.fit(&layout(&[("3g.40gb", 0)]), "3g.40gb"), Some(4));
        assert_eq!(m.fit(&layout(&[("3g.40gb", 0)]), "4g.40gb"), None);
        assert_eq!(m.fit(&layout(&[("1g.10gb", 0)]), "2g.20gb"), Some(2));
        assert_eq!(m.fit(&layout(&[("7g.80gb", 0)]), "1g.10gb"), None);
    }

    #[test]
    fn layouts_parse_with_or_without_starts() {
        let m = a100();
        let entries = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            m.parse_layout(&entries(&["3g.40gb", "2g.20gb", "1g.10gb"])),
            Ok(layout(&[("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]))
        );
        // Slice 7 is no start of a 1-slice instance: a fourth one has no room.
        assert!(
            m.parse_layout(&entries(&["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]))
                .expect_err("invalid")
                .contains("no room left for 1g.10gb after 3")
        );
        assert_eq!(
            m.parse_layout(&entries(&["1g.10gb@6", "3g.40gb"])),
            Ok(layout(&[("1g.10gb", 6), ("3g.40gb", 0)]))
        );
        assert!(
            m.parse_layout(&entries(&["7g.80gb", "1g.10gb"]))
                .expect_err("invalid")
                .contains("no room left")
        );
        assert!(
            m.parse_layout(&entries(&["3g.40gb@x"]))
                .expect_err("invalid")
                .contains("bad MIG start")
        );
        assert!(
            m.parse_layout(&entries(&["1g.5gb"]))
                .expect_err("invalid")
                .contains("does not support")
        );
    }

    /// The rule, restated independently: slices occupied as sets, no intersections.
    fn valid_by_sets(m: &MigModel, l: &[Instance]) -> bool {
        let mut used = std::collections::BTreeSet::new();
        let mut compute = 0;
        for i in l {
            let Some(p) = m.profile(&i.profile) else {
                return false;
            };
            if !p.starts.contains(&i.start)
                || l.iter().filter(|j| j.profile == i.profile).count()
                    > usize::from(p.max_instances)
            {
                return false;
            }
            for s in i.start..i.start + p.memory_slices {
                if s >= MEMORY_SLICES || !used.insert(s) {
                    return false;
                }
            }
            compute += p.compute_slices;
        }
        compute <= COMPUTE_SLICES
    }

    proptest! {
        /// `check` agrees with the set-based restatement, on every model, for random layouts.
        #[test]
        fn check_matches_the_rule(
            model_ix in 0usize..4,
            items in proptest::collection::vec((0usize..8, 0u8..9), 0..9),
        ) {
            let m = &MODELS[model_ix];
            let l: Vec<Instance> = items
                .iter()
                .map(|(p, s)| Instance {
                    profile: m.profiles.get(*p).map_or("bogus", |p| p.name).to_owned(),
                    start: *s,
                })
                .collect();
            prop_assert_eq!(m.check(&l).is_ok(), valid_by_sets(m, &l), "{:?}", l);
        }

        /// Filling a GPU with `fit` always leaves a valid layout.
        #[test]
        fn fit_keeps_layouts_valid(model_ix in 0usize..4, wants in proptest::collection::vec(0usize..7, 0..12)) {
            let m = &MODELS[model_ix];
            let mut l = Vec::new();
            for w in wants {
                let p = m.profiles[w].name;
                if let Some(start) = m.fit(&l, p) {
                    l.push(Instance { profile: p.to_owned(), start });
                }
                prop_assert!(m.check(&l).is_ok(), "{:?}", l);
            }
        }
    }
}
