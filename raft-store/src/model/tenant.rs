//! Tenants as replicated records: per-GPU-type quotas (a guaranteed share and how much more may
//! be borrowed from idle capacity), a fair-share weight and a default priority; and the GPU-time
//! accounting read from the jobs' own records.
//!
//! A tenant with no record (every tenant before tenants existed) is unlimited, weighs 1 and
//! has default priority 0: its jobs run exactly as they did. A record limits only the GPU types
//! it names; other types stay unlimited for it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::job::Job;
use crate::model::node::NodeRecord;
use crate::model::validate;

/// Most GPUs one quota figure may name (a bound against typos like 10^12, far above any
/// cluster; a quota above the cluster's size is allowed and reported).
pub const MAX_QUOTA_GPUS: u32 = 1_000_000;
/// Most GPU types one tenant may have quotas for.
pub const MAX_QUOTA_TYPES: usize = 32;
/// Fair-share weights accepted.
pub const WEIGHT_RANGE: std::ops::RangeInclusive<u32> = 1..=10_000;
/// Default priorities accepted.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = -10_000..=10_000;

/// What a tenant may hold of one GPU type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// GPUs of this type the tenant is entitled to.
    pub guaranteed: u32,
    /// GPUs beyond the guarantee it may borrow while they are idle.
    #[serde(default)]
    pub borrow: u32,
}

impl Quota {
    /// The most GPUs of the type the tenant may hold at once.
    pub fn limit(&self) -> u32 {
        self.guaranteed.saturating_add(self.borrow)
    }
}

/// A tenant's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    pub name: String,
    /// GPU type (as nodes report it, e.g. `A100`) → quota.
    #[serde(default)]
    pub quotas: BTreeMap<String, Quota>,
    /// Share of the cluster in the fair-share ordering, relative to other tenants (1 = the
    /// weight of a tenant without a record).
    #[serde(default = "one")]
    pub weight: u32,
    /// The priority a job of this tenant gets when it is submitted without one.
    #[serde(default)]
    pub default_priority: i32,
    #[serde(default)]
    pub created_at_ms: u64,
    #[serde(default)]
    pub updated_at_ms: u64,
}

fn one() -> u32 {
    1
}

impl TenantRecord {
    /// The quota of `gpu_type`, if the record limits it.
    pub fn quota(&self, gpu_type: &str) -> Option<Quota> {
        self.quotas.get(gpu_type).copied()
    }
}

/// The rules the API edge and `apply` both enforce. GPU types no node has (yet) are allowed:
/// quotas are often set before the hardware arrives.
pub fn validate(t: &TenantRecord) -> Result<(), String> {
    validate::name("tenant", &t.name)?;
    if t.quotas.len() > MAX_QUOTA_TYPES {
        return Err(format!("at most {MAX_QUOTA_TYPES} GPU types per tenant"));
    }
    for (gpu_type, q) in &t.quotas {
        validate::name("GPU type", gpu_type)?;
        if q.guaranteed > MAX_QUOTA_GPUS || q.borrow > MAX_QUOTA_GPUS {
            return Err(format!(
                "quota for {gpu_type} must be at most {MAX_QUOTA_GPUS} GPUs guaranteed and {MAX_QUOTA_GPUS} borrowed"
            ));
        }
    }
    if !WEIGHT_RANGE.contains(&t.weight) {
        return Err(format!(
            "weight must be {}..={}, got {}",
            WEIGHT_RANGE.start(),
            WEIGHT_RANGE.end(),
            t.weight
        ));
    }
    if !PRIORITY_RANGE.contains(&t.default_priority) {
        return Err(format!(
            "default priority must be {}..={}, got {}",
            PRIORITY_RANGE.start(),
            PRIORITY_RANGE.end(),
            t.default_priority
        ));
    }
    Ok(())
}

/// GPU-milliseconds by GPU type.
pub type GpuTime = BTreeMap<String, u64>;

/// The GPU types of the GPUs a job's current (or last) binding names, as the node reports
/// them; GPUs the node no longer lists count as `unknown`.
pub fn bound_types<'a>(
    job: &'a Job,
    nodes: &'a BTreeMap<crate::NodeId, NodeRecord>,
) -> impl Iterator<Item = &'a str> + 'a {
    job.members().flat_map(move |b| {
        let node = nodes.get(&b.node);
        b.gpus.iter().map(move |&i| {
            node.and_then(|n| n.gpu(i))
                .map_or("unknown", |g| g.gpu_type.as_str())
        })
    })
}

/// GPUs held by live jobs, per (tenant, GPU type).
pub fn held_by_type(
    jobs: &BTreeMap<crate::JobId, Job>,
    nodes: &BTreeMap<crate::NodeId, NodeRecord>,
) -> BTreeMap<(String, String), u32> {
    let mut held = BTreeMap::new();
    for j in jobs.values().filter(|j| j.state.is_live()) {
        for t in bound_types(j, nodes) {
            *held
                .entry((j.spec.tenant.clone(), t.to_owned()))
                .or_insert(0) += 1;
        }
    }
    held
}

/// The GPU time of a job: its finished runs (recorded by `apply` as each run ended) plus the
/// live run up to `now_ms`.
pub fn job_gpu_time(
    job: &Job,
    nodes: &BTreeMap<crate::NodeId, NodeRecord>,
    now_ms: u64,
) -> GpuTime {
    let mut out = job.gpu_ms.clone();
    if job.state.is_live()
        && let Some(since) = job.bound_at_ms
    {
        let held = now_ms.saturating_sub(since);
        for t in bound_types(job, nodes) {
            *out.entry(t.to_owned()).or_insert(0) += held;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> TenantRecord {
        TenantRecord {
            name: "vision".into(),
            quotas: BTreeMap::from([(
                "A100".into(),
                Quota {
                    guaranteed: 4,
                    borrow: 2,
                },
            )]),
            weight: 2,
            default_priority: 3,
            created_at_ms: 0,
            updated_at_ms: 0,
        }
    }

    #[test]
    fn the_rules() {
        assert_eq!(validate(&record()), Ok(()));
        assert_eq!(record().quota("A100").map(|q| q.limit()), Some(6));
        let above_any_cluster = TenantRecord {
            quotas: BTreeMap::from([(
                "H100".into(),
                Quota {
                    guaranteed: MAX_QUOTA_GPUS,
                    borrow: 0,
                },
            )]),
            ..record()
        };
        assert_eq!(validate(&above_any_cluster), Ok(()), "allowed, reported");
        let bad = [
            TenantRecord {
                name: "../x".into(),
                ..record()
            },
            TenantRecord {
                weight: 0,
                ..record()
            },
            TenantRecord {
                weight: 10_001,
                ..record()
            },
            TenantRecord {
                default_priority: i32::MIN,
                ..record()
            },
            TenantRecord {
                quotas: BTreeMap::from([(
                    "A100".into(),
                    Quota {
                        guaranteed: MAX_QUOTA_GPUS + 1,
                        borrow: 0,
                    },
                )]),
                ..record()
            },
            TenantRecord {
                quotas: BTreeMap::from([(
                    "A100".into(),
                    Quota {
                        guaranteed: 0,
                        borrow: u32::MAX,
                    },
                )]),
                ..record()
            },
            TenantRecord {
                quotas: BTreeMap::from([("A 100\n".into(), Quota::default())]),
                ..record()
            },
            TenantRecord {
                quotas: (0..=MAX_QUOTA_TYPES)
                    .map(|i| (format!("T{i}"), Quota::default()))
                    .collect(),
                ..record()
            },
        ];
        for b in bad {
            assert!(validate(&b).is_err(), "{b:?} must be refused");
        }
    }

    fn apply(s: &mut crate::ClusterState, at: u64, cmd: crate::Command) -> crate::ApplyResult {
        s.apply(&crate::LogEntry {
            proposed_at_ms: at,
            cmd,
            meta: None,
        })
    }

    #[test]
    fn apply_creates_updates_and_refuses_with_nothing_changed() {
        use crate::{ApplyResult, Command, Rejection};
        let mut s = crate::ClusterState::new();
        let create = |t: TenantRecord| Command::CreateTenant { tenant: t };
        assert_eq!(apply(&mut s, 10, create(record())), ApplyResult::Ok);
        assert_eq!(s.tenants["vision"].created_at_ms, 10);
        let before = s.clone();
        for cmd in [
            create(record()),
            Command::UpdateTenant {
                tenant: TenantRecord {
                    name: "nobody".into(),
                    ..record()
                },
            },
            Command::UpdateTenant {
                tenant: TenantRecord {
                    weight: 0,
                    ..record()
                },
            },
        ] {
            let r = apply(&mut s, 20, cmd.clone());
            assert!(matches!(r, ApplyResult::Rejected { .. }), "{cmd}: {r:?}");
            assert_eq!(s, before, "{cmd} changed the state");
        }
        let update = Command::UpdateTenant {
            tenant: TenantRecord {
                weight: 5,
                created_at_ms: 999,
                ..record()
            },
        };
        assert_eq!(apply(&mut s, 30, update), ApplyResult::Ok);
        let t = &s.tenants["vision"];
        assert_eq!((t.weight, t.created_at_ms, t.updated_at_ms), (5, 10, 30));
        assert!(matches!(
            apply(
                &mut s,
                40,
                Command::UpdateTenant {
                    tenant: TenantRecord {
                        name: "ghost".into(),
                        ..record()
                    }
                }
            ),
            ApplyResult::Rejected {
                reason: Rejection::UnknownTenant { .. }
            }
        ));
    }

    #[test]
    fn gpu_time_is_accounted_per_run_by_type() {
        use crate::model::node::{GpuRecord, Inventory};
        use crate::{Bind, Command, JobSpec, Outcome};
        let gpu = |index: u32, gpu_type: &str| GpuRecord {
            index,
            uuid: format!("GPU-{index}"),
            model: gpu_type.into(),
            gpu_type: gpu_type.into(),
            memory_mib: 1,
            numa_node: None,
            nvlink_peers: vec![],
            healthy: true,
        };
        let mut s = crate::ClusterState::new();
        apply(
            &mut s,
            0,
            Command::RegisterNode {
                node: 1,
                addr: "h:1".into(),
                labels: BTreeMap::new(),
                inventory: Inventory {
                    gpus: vec![gpu(0, "A100"), gpu(1, "T4"), gpu(2, "T4")],
                    cpu_cores: 1,
                    memory_mib: 1,
                },
                edge: None,
                protocol: 1,
            },
        );
        let spec = JobSpec {
            name: "j".into(),
            tenant: "vision".into(),
            command: vec!["true".into()],
            env: BTreeMap::new(),
            workdir: None,
            gpus: 2,
            gpu_types: Default::default(),
            min_gpu_memory_mib: 0,
            node_selector: BTreeMap::new(),
            priority: 0,
            runtime_estimate_s: None,
            wall_time_limit_s: None,
            max_attempts: 3,
            cpu_millis: None,
            memory_mib: None,
            nodes: 0,
            slice: None,
            kind: Default::default(),
        };
        apply(
            &mut s,
            0,
            Command::SubmitJob {
                spec,
                idempotency_key: None,
            },
        );
        let bind = |gpus: Vec<u32>| Command::BindJobs {
            binds: vec![Bind {
                job: 1,
                node: 1,
                gpus,
            }],
        };
        // Run 1: A100 + T4 from 1 s to 4 s, lost and requeued; run 2: two T4s from 5 s.
        apply(&mut s, 1_000, bind(vec![0, 1]));
        let lost = Outcome::Lost {
            message: "x".into(),
        };
        apply(
            &mut s,
            4_000,
            Command::JobFinished {
                job: 1,
                generation: 1,
                outcome: lost,
            },
        );
        apply(&mut s, 5_000, bind(vec![1, 2]));
        let job = &s.jobs[&1];
        assert_eq!(
            job.gpu_ms,
            BTreeMap::from([("A100".into(), 3_000), ("T4".into(), 3_000)])
        );
        assert_eq!(
            job_gpu_time(job, &s.nodes, 6_000),
            BTreeMap::from([("A100".into(), 3_000), ("T4".into(), 5_000)]),
            "the live run counts up to now"
        );
    }
}
