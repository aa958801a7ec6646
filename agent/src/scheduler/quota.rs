//! Quota admission for one pass: the GPUs each tenant with a record holds, by GPU type, and
//! which GPU types a pending job may still take without going over its tenant's limit
//! (guarantee plus borrowing). A tenant without a record, and a GPU type its record does not
//! name, are unlimited.
//!
//! Borrowing takes idle GPUs: any free GPU of the type, including GPUs another tenant is
//! guaranteed but is not using. They are given back when the borrower's jobs end.

use std::collections::{BTreeSet, HashMap};

use gpu_raft_store::tenant::{self, TenantRecord};
use gpu_raft_store::{ClusterState, JobSpec};

/// What a pending job may take.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Anything its spec accepts.
    Unlimited,
    /// Only these GPU types (the accepted ones its tenant still has room for, in the job's
    /// order).
    Only(Vec<String>),
    /// Nothing: every GPU type it accepts is at its tenant's limit. The pending reason.
    OverQuota(String),
}

/// GPUs held per (tenant, GPU type), for tenants whose records name quotas.
pub(crate) struct QuotaBook<'a> {
    tenants: &'a std::collections::BTreeMap<String, TenantRecord>,
    held: HashMap<(&'a str, &'a str), u32>,
    /// Every GPU type some node has, for jobs that accept any type.
    types: BTreeSet<&'a str>,
}

impl<'a> QuotaBook<'a> {
    pub(super) fn new(state: &'a ClusterState) -> Self {
        let mut book = Self {
            tenants: &state.tenants,
            held: HashMap::new(),
            types: BTreeSet::new(),
        };
        if !state.tenants.values().any(|t| !t.quotas.is_empty()) {
            return book;
        }
        book.types = state
            .nodes
            .values()
            .flat_map(|n| n.inventory.gpus.iter().map(|g| g.gpu_type.as_str()))
            .collect();
        for j in state.jobs.values().filter(|j| j.state.is_live()) {
            if book.limited(&j.spec.tenant) {
                for t in tenant::bound_types(j, &state.nodes) {
                    *book.held.entry((j.spec.tenant.as_str(), t)).or_insert(0) += 1;
                }
            }
        }
        book
    }

    fn limited(&self, tenant: &str) -> bool {
        self.tenants
            .get(tenant)
            .is_some_and(|t| !t.quotas.is_empty())
    }

    /// GPUs of `gpu_type` that `tenant` holds (live jobs and this pass's placements).
    pub(super) fn held(&self, tenant: &str, gpu_type: &str) -> u32 {
        self.held.get(&(tenant, gpu_type)).copied().unwrap_or(0)
    }

    /// Which GPU types `spec` may take now.
    pub(super) fn admit(&self, spec: &JobSpec) -> Admission {
        let Some(record) = self.tenants.get(&spec.tenant).filter(|_| spec.gpus > 0) else {
            return Admission::Unlimited;
        };
        if record.quotas.is_empty() {
            return Admission::Unlimited;
        }
        let accepted: Vec<&str> = if spec.gpu_types.is_empty() {
            self.types.iter().copied().collect()
        } else {
            spec.gpu_types.iter().map(String::as_str).collect()
        };
        let mut room = Vec::new();
        let mut full = Vec::new();
        for t in &accepted {
            match record.quota(t) {
                Some(q) => {
                    let held = self.held(&spec.tenant, t);
                    if held.saturating_add(spec.gpus) <= q.limit() {
                        room.push((*t).to_owned());
                    } else {
                        full.push(format!(
                            "holds {held} of its {} {t} GPUs ({} guaranteed + {} borrowed)",
                            q.limit(),
                            q.guaranteed,
                            q.borrow
                        ));
                    }
                }
                None => {
                    room.push((*t).to_owned());
                }
            }
        }
        if full.is_empty() {
            Admission::Unlimited
        } else if room.is_empty() {
            Admission::OverQuota(format!(
                "over quota: tenant {} {} and needs {} more",
                spec.tenant,
                full.join(", "),
                spec.gpus
            ))
        } else {
            Admission::Only(room)
        }
    }

    /// Whether `spec` would take its tenant beyond its guarantee of every GPU type it accepts,
    /// so that no run may be preempted for it (it would borrow) wherever it were placed.
    pub(super) fn borrows_whatever_it_gets(&self, spec: &JobSpec) -> bool {
        let Some(record) = self.tenants.get(&spec.tenant).filter(|_| spec.gpus > 0) else {
            return false;
        };
        let over = |t: &str| {
            record.quota(t).is_some_and(|q| {
                self.held(&spec.tenant, t).saturating_add(spec.gpus) > q.guaranteed
            })
        };
        if spec.gpu_types.is_empty() {
            !self.types.is_empty() && self.types.iter().all(|t| over(t))
        } else {
            spec.gpu_types.iter().all(|t| over(t))
        }
    }

    /// Count GPUs of these types as held by `tenant` from now on in this pass.
    pub(super) fn take(&mut self, tenant: &'a str, types: impl Iterator<Item = &'a str>) {
        if self.limited(tenant) {
            for t in types {
                *self.held.entry((tenant, t)).or_insert(0) += 1;
            }
        }
    }
}

/// `spec` restricted to the GPU types `only` (what a job of a tenant near its quota may use).
pub(crate) fn restrict(spec: &JobSpec, only: Vec<String>) -> JobSpec {
    JobSpec {
        gpu_types: only,
        ..spec.clone()
    }
}
