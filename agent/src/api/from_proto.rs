//! Wire → domain conversions for the public API, the only place they happen: requests become
//! domain values here (syntax only; `apply` validates the content). Generated types are always
//! written `pb::…`.

use std::collections::BTreeMap;

use gpu_proto::v1 as pb;
use gpu_raft_store::container::{ContainerSpec, Mount};
use gpu_raft_store::tenant::{Quota, TenantRecord};
use gpu_raft_store::webhook::{NotifyEvent, Webhook};
use gpu_raft_store::{
    Account, DEFAULT_RETRY_BACKOFF_S, DEFAULT_TENANT, JobKind, JobSpec, JobState, Role,
    SchedulerSettings, Seat, SliceRequest, TokenLimits, parse_dependencies,
};

pub fn role(r: i32) -> Option<Role> {
    match pb::Role::try_from(r).ok()? {
        pb::Role::Admin => Some(Role::Admin),
        pb::Role::Operator => Some(Role::Operator),
        pb::Role::TenantAdmin => Some(Role::TenantAdmin),
        pb::Role::User => Some(Role::User),
        pb::Role::Viewer => Some(Role::Viewer),
        pb::Role::Node => Some(Role::Node),
        pb::Role::Unspecified => None,
    }
}

pub fn job_state(s: i32) -> Option<JobState> {
    match pb::JobState::try_from(s).ok()? {
        pb::JobState::Pending => Some(JobState::Pending),
        pb::JobState::Bound => Some(JobState::Bound),
        pb::JobState::Running => Some(JobState::Running),
        pb::JobState::Succeeded => Some(JobState::Succeeded),
        pb::JobState::Failed => Some(JobState::Failed),
        pb::JobState::Cancelled => Some(JobState::Cancelled),
        pb::JobState::Unspecified => None,
    }
}

/// A submitted spec in domain form. Syntax only (a kind gpumesh does not know, a MIG profile
/// together with a shared slice): `apply` validates the content.
pub fn spec(p: pb::JobSpec) -> Result<JobSpec, String> {
    let kind = match p.kind.as_str() {
        "" | "process" => JobKind::Process,
        "vm" => JobKind::Vm,
        other => return Err(format!("unknown job kind {other:?} (process, vm)")),
    };
    let shared = p.shared_memory_mib > 0 || p.gpu_share > 0;
    let slice = match (p.mig_profile.is_empty(), shared) {
        (false, true) => {
            return Err("a job asks for a MIG profile or a shared slice, not both".into());
        }
        (false, false) => Some(SliceRequest::Mig {
            profile: p.mig_profile,
        }),
        (true, true) => Some(SliceRequest::Shared {
            memory_mib: p.shared_memory_mib,
            share: p.gpu_share,
        }),
        (true, false) => None,
    };
    let mut after = Vec::new();
    for text in &p.after {
        after.extend(parse_dependencies(text).map_err(|e| format!("--after: {e}"))?);
    }
    let array = match p.array.trim() {
        "" => None,
        text => Some(text.parse()?),
    };
    Ok(JobSpec {
        after,
        labels: p.labels.into_iter().collect(),
        notify: match p.notify_url.is_empty() {
            true if p.notify_events.is_empty() => None,
            true => return Err("notify events need a notify URL".into()),
            false => Some(webhook(&pb::Webhook {
                url: p.notify_url,
                events: p.notify_events,
            })?),
        },
        singleton: p.singleton,
        array,
        account: None,
        retry_backoff_s: retry_backoff(p.max_attempts, p.retry_backoff_s),
        name: p.name,
        tenant: if p.tenant.is_empty() {
            DEFAULT_TENANT.to_owned()
        } else {
            p.tenant
        },
        command: p.command,
        env: p.env.into_iter().collect(),
        workdir: (!p.workdir.is_empty()).then_some(p.workdir),
        gpus: p.gpus,
        gpu_types: p.gpu_types,
        min_gpu_memory_mib: p.min_gpu_memory_mib,
        node_selector: p.node_selector.into_iter().collect(),
        priority: p.priority.unwrap_or(0),
        runtime_estimate_s: p.runtime_estimate_s,
        wall_time_limit_s: p.wall_time_limit_s,
        max_attempts: p.max_attempts.max(1),
        cpu_millis: p.cpu_millis,
        memory_mib: p.memory_mib,
        nodes: p.nodes,
        topology: (!p.topology.is_empty()).then_some(p.topology),
        slice,
        kind,
        container: p.container.map(|c| {
            Box::new(ContainerSpec {
                image: c.image,
                mounts: c
                    .mounts
                    .into_iter()
                    .map(|m| Mount {
                        source: m.source,
                        target: m.target,
                        read_only: m.read_only,
                    })
                    .collect(),
            })
        }),
    })
}

/// A job that may be tried more than once retries failed runs, after the default backoff
/// unless it names one. A backoff given with one attempt is passed on for `validate` to refuse.
fn retry_backoff(max_attempts: u32, given: Option<u64>) -> Option<u64> {
    match given {
        None if max_attempts > 1 => Some(DEFAULT_RETRY_BACKOFF_S),
        given => given,
    }
}

/// The transport fault rule an `InjectNetworkFault` request asks for (not yet validated).
pub fn fault_rule(req: &pb::InjectNetworkFaultRequest) -> crate::raft::transport_faults::FaultRule {
    let ms = |v: u32| std::time::Duration::from_millis(u64::from(v));
    crate::raft::transport_faults::FaultRule {
        delay_min: ms(req.delay_min_ms),
        delay_max: ms(req.delay_max_ms),
        drop_per_mille: req.drop_per_mille,
        duplicate_per_mille: req.duplicate_per_mille,
        peers: req.peers.iter().copied().collect(),
    }
}

/// The settings a `SetSchedulerPolicyRequest` asks for, starting from the current ones.
pub fn scheduler_settings(
    req: &pb::SetSchedulerPolicyRequest,
    current: &SchedulerSettings,
) -> Result<SchedulerSettings, String> {
    let (ordering, backfill) =
        gpu_raft_store::scheduler::parse_spec(req.policy.trim()).map_err(|e| e.to_string())?;
    Ok(SchedulerSettings {
        ordering,
        backfill,
        aging_per_hour: req.aging_per_hour.unwrap_or(current.aging_per_hour),
        fairshare_weight: req.fairshare_weight.unwrap_or(current.fairshare_weight),
        usage_half_life_s: req.usage_half_life_s.unwrap_or(current.usage_half_life_s),
        preemption: match &req.preemption {
            Some(p) => p.trim().parse()?,
            None => current.preemption,
        },
        gang_wait_limit_s: req.gang_wait_limit_s.unwrap_or(current.gang_wait_limit_s),
        preempt_exempt_s: req.preempt_exempt_s.unwrap_or(current.preempt_exempt_s),
    })
}

/// A rule as the API received it, in the flat form the config file uses too. Zero durations
/// and empty strings mean "the default".
pub fn alert_rule(p: pb::AlertRule) -> crate::monitor::rules::FlatRule {
    let d = |ms: u64| (ms > 0).then(|| std::time::Duration::from_millis(ms));
    let text = |s: String| (!s.is_empty()).then_some(s);
    crate::monitor::rules::FlatRule {
        name: p.name,
        metric: text(p.metric),
        above: p.above,
        rate_per_minute: p.rate_per_minute,
        predict_limit: p.predict_limit,
        fatal_xids: (p.health || !p.fatal_xids.is_empty()).then_some(p.fatal_xids),
        for_: d(p.for_ms),
        window: d(p.window_ms),
        within: d(p.within_ms),
        clear_after: d(p.clear_after_ms),
        severity: text(p.severity),
        action: text(p.action),
        enabled: Some(p.enabled),
    }
}

/// An account as the API received it. Syntax only (an empty group is "the user's own");
/// `validate::account` judges the names, both at the edge and in `apply`.
pub fn account(p: &pb::Account) -> Account {
    Account {
        user: p.user.clone(),
        group: (!p.group.is_empty()).then(|| p.group.clone()),
        groups: p.groups.clone(),
    }
}

/// The account a `SetTokenAccountRequest` asks for: `Some` to set, `None` to clear (only with
/// `clear`, so a request that simply lacks the account is refused rather than read as a clear).
/// The limits a new token asks for, at `now_ms`: a join token works for a day and once unless
/// it asks otherwise; other tokens until revoked unless given a lifetime.
pub fn token_limits(
    req: &pb::CreateTokenRequest,
    role: Role,
    now_ms: u64,
) -> Result<TokenLimits, String> {
    let join = role == Role::Node;
    let ttl_s = req.ttl_s.or(join.then_some(JOIN_TOKEN_TTL_S));
    if ttl_s == Some(0) || ttl_s.is_some_and(|t| t > MAX_TOKEN_TTL_S) {
        return Err(format!(
            "a token's lifetime must be 1s..={} days",
            MAX_TOKEN_TTL_S / 86_400
        ));
    }
    let ids = match (req.node_id_first, req.node_id_last) {
        (0, 0) => None,
        (first, 0) => Some((first, first)),
        (first, last) => Some((first, last)),
    };
    if !join && (req.uses.is_some() || ids.is_some() || !req.seat.is_empty()) {
        return Err("only join tokens (role node) have uses, node ids and a seat".into());
    }
    let seat = match req.seat.as_str() {
        "" => None,
        s => Some(Seat::parse(s)?),
    };
    if req.uses.is_some_and(|u| u == 0 || u > MAX_JOIN_USES) {
        return Err(format!("a join token's uses must be 1..={MAX_JOIN_USES}"));
    }
    Ok(TokenLimits {
        expires_at_ms: ttl_s.map(|t| now_ms.saturating_add(t.saturating_mul(1000))),
        uses_left: req.uses.or(join.then_some(1)),
        node_ids: ids,
        seat,
    })
}

/// How long a join token works unless asked otherwise.
const JOIN_TOKEN_TTL_S: u64 = 86_400;
/// The longest lifetime a token can be given (10 years).
const MAX_TOKEN_TTL_S: u64 = 10 * 365 * 86_400;
/// The most enrolments one join token can be given.
const MAX_JOIN_USES: u32 = 10_000;

pub fn token_account(req: &pb::SetTokenAccountRequest) -> Result<Option<Account>, String> {
    match (&req.account, req.clear) {
        (Some(a), false) => Ok(Some(account(a))),
        (None, true) => Ok(None),
        (Some(_), true) => Err("give an account or clear, not both".into()),
        (None, false) => Err("an account is required (or clear, to remove the mapping)".into()),
    }
}

/// The tenant record a `CreateTenantRequest` asks for. Syntax only: `apply` validates it.
pub fn tenant_created(req: &pb::CreateTenantRequest) -> Result<TenantRecord, String> {
    Ok(TenantRecord {
        account: req.account.as_ref().map(account),
        name: req.name.trim().to_owned(),
        quotas: quota_map(&req.quotas)?,
        weight: req.weight.unwrap_or(1),
        default_priority: req.default_priority.unwrap_or(0),
        created_at_ms: 0,
        updated_at_ms: 0,
        allowed_mounts: req.allowed_mounts.clone(),
        max_priority: req.max_priority,
        max_pending_jobs: req.max_pending_jobs,
        webhook: req.webhook.as_ref().map(webhook).transpose()?,
    })
}

/// `current` with an `UpdateTenantRequest`'s changes.
pub fn tenant_updated(
    req: &pb::UpdateTenantRequest,
    current: &TenantRecord,
) -> Result<TenantRecord, String> {
    let mut quotas = current.quotas.clone();
    for t in &req.remove_quotas {
        if quotas.remove(t).is_none() {
            return Err(format!("tenant {} has no quota for {t}", current.name));
        }
    }
    quotas.extend(quota_map(&req.quotas)?);
    let account = match (&req.account, req.clear_account) {
        (Some(_), true) => return Err("give an account or clear it, not both".into()),
        (Some(a), false) => Some(account(a)),
        (None, true) => None,
        (None, false) => current.account.clone(),
    };
    let mut allowed_mounts = current.allowed_mounts.clone();
    for dir in &req.disallow_mounts {
        let before = allowed_mounts.len();
        allowed_mounts.retain(|d| d != dir);
        if allowed_mounts.len() == before {
            return Err(format!(
                "tenant {} does not allow mounts of {dir}",
                current.name
            ));
        }
    }
    for dir in &req.allow_mounts {
        if !allowed_mounts.contains(dir) {
            allowed_mounts.push(dir.clone());
        }
    }
    Ok(TenantRecord {
        account,
        quotas,
        allowed_mounts,
        weight: req.weight.unwrap_or(current.weight),
        default_priority: req.default_priority.unwrap_or(current.default_priority),
        max_priority: req.max_priority.or(current.max_priority),
        max_pending_jobs: match req.max_pending_jobs {
            Some(0) => None,
            Some(cap) => Some(cap),
            None => current.max_pending_jobs,
        },
        webhook: match (&req.webhook, req.clear_webhook) {
            (Some(_), true) => return Err("give a webhook or clear it, not both".into()),
            (Some(w), false) => Some(webhook(w)?),
            (None, true) => None,
            (None, false) => current.webhook.clone(),
        },
        ..current.clone()
    })
}

/// A webhook as the API gives it: its events by name.
pub fn webhook(w: &pb::Webhook) -> Result<Webhook, String> {
    let events = (w.events.iter())
        .map(|e| e.parse::<NotifyEvent>())
        .collect::<Result<_, _>>()?;
    Ok(Webhook {
        url: w.url.clone(),
        events,
    })
}

fn quota_map(quotas: &[pb::GpuQuota]) -> Result<BTreeMap<String, Quota>, String> {
    let mut out = BTreeMap::new();
    for q in quotas {
        let quota = Quota {
            guaranteed: q.guaranteed,
            borrow: q.borrow,
        };
        if out.insert(q.gpu_type.clone(), quota).is_some() {
            return Err(format!("GPU type {} appears twice", q.gpu_type));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_tokens_work_once_for_a_day_unless_asked_otherwise() {
        let req = |ttl_s, uses, first, last| pb::CreateTokenRequest {
            ttl_s,
            uses,
            node_id_first: first,
            node_id_last: last,
            ..Default::default()
        };
        let join = token_limits(&req(None, None, 0, 0), Role::Node, 1_000).expect("valid");
        assert_eq!(join.expires_at_ms, Some(1_000 + 86_400_000));
        assert_eq!((join.uses_left, join.node_ids), (Some(1), None));
        let user = token_limits(&req(None, None, 0, 0), Role::User, 1_000).expect("valid");
        assert!(
            user.is_none(),
            "an API token works until revoked by default"
        );
        let one = token_limits(&req(Some(60), Some(3), 4, 0), Role::Node, 0).expect("valid");
        assert_eq!(
            (one.expires_at_ms, one.uses_left, one.node_ids),
            (Some(60_000), Some(3), Some((4, 4)))
        );
        for (bad, role) in [
            (req(Some(0), None, 0, 0), Role::Node),
            (req(None, Some(0), 0, 0), Role::Node),
            (req(None, Some(2), 0, 0), Role::User),
            (req(None, None, 3, 5), Role::Admin),
        ] {
            assert!(token_limits(&bad, role, 0).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn failed_runs_are_retried_by_default_only_when_attempts_allow() {
        let spec = |max_attempts, retry_backoff_s| {
            let p = pb::JobSpec {
                max_attempts,
                retry_backoff_s,
                command: vec!["true".into()],
                ..Default::default()
            };
            super::spec(p).expect("converts").retry_backoff_s
        };
        assert_eq!(spec(0, None), None);
        assert_eq!(spec(1, None), None);
        assert_eq!(spec(3, None), Some(DEFAULT_RETRY_BACKOFF_S));
        assert_eq!(spec(3, Some(0)), Some(0), "zero: retried at once");
        assert_eq!(
            spec(1, Some(5)),
            Some(5),
            "passed on for validation to refuse"
        );
    }
}
