//! `gpuctl tenant create|update|get|list|set-registry-credential|webhook-secret`.
//!
//! JSON (stable): a tenant is `{"name", "has_record" (false: known only from its jobs, so
//! unlimited), "quotas": [{"gpu_type", "guaranteed", "borrow"}], "weight", "default_priority",
//! "max_priority" (the highest its users may give a job), "max_pending_jobs" (null: no cap), "account" (the default Unix account of its jobs: null, or `{"user", "group", "groups"}`),
//! "allowed_mounts": [dir], "webhook" (null, or `{"url", "events"}`), "registry_logins": [{"registry", "username", "set_at_ms"}] (never a
//! password),
//! "created_at_ms", "updated_at_ms", "pending_jobs", "live_jobs", "usage": [{"gpu_type",
//! "gpus_held", "gpu_seconds", "cluster_gpus"}], "warnings": [string]}`; `get` adds
//! `"jobs": [{"job_id", "gpu_type", "gpu_seconds"}]` (its 1000 most recent jobs). `create`,
//! `update` and `get` print one tenant, `list` an array. GPU-seconds are decimals with
//! millisecond precision.

use gpu_proto::v1 as pb;
use gpu_proto::v1::tenant_service_client::TenantServiceClient;
use serde_json::{Value, json};

use super::{Answer, Ctx, Failure, account};
use crate::cli::{TenantVerb, WebhookArgs};
use crate::output::{fields, table, table_of};

pub(crate) async fn run(ctx: &Ctx, verb: TenantVerb) -> Result<Answer, Failure> {
    let new = TenantServiceClient::new;
    let tenant = match verb {
        TenantVerb::Create {
            name,
            quotas,
            weight,
            default_priority,
            max_priority,
            max_pending_jobs,
            account,
            allow_mounts,
            webhook,
        } => {
            let req = pb::CreateTenantRequest {
                webhook: webhook_pb(webhook),
                name,
                quotas: quotas_pb(quotas),
                weight,
                default_priority,
                max_priority,
                max_pending_jobs,
                account: account::from_args(account),
                allowed_mounts: allow_mounts,
            };
            ctx.call(new, req, async |mut c, r| c.create_tenant(r).await)
                .await?
        }
        TenantVerb::Update {
            name,
            quotas,
            remove_quotas,
            weight,
            default_priority,
            max_priority,
            max_pending_jobs,
            account,
            clear_account,
            allow_mounts,
            disallow_mounts,
            webhook,
            clear_webhook,
        } => {
            let req = pb::UpdateTenantRequest {
                webhook: webhook_pb(webhook),
                clear_webhook,
                name,
                quotas: quotas_pb(quotas),
                remove_quotas,
                weight,
                default_priority,
                max_priority,
                max_pending_jobs,
                account: account::from_args(account),
                clear_account,
                allow_mounts,
                disallow_mounts,
            };
            ctx.call(new, req, async |mut c, r| c.update_tenant(r).await)
                .await?
        }
        TenantVerb::Get { name, stale } => {
            let req = pb::GetTenantRequest { name, stale };
            ctx.call(new, req, async |mut c, r| c.get_tenant(r).await)
                .await?
        }
        TenantVerb::SetRegistryCredential {
            tenant,
            registry,
            username,
            password_file,
            remove,
        } => {
            let password = match &password_file {
                Some(path) => read_password(path).map_err(Failure::Usage)?,
                None => String::new(),
            };
            let req = pb::SetRegistryCredentialRequest {
                tenant,
                registry,
                username: username.unwrap_or_default(),
                password,
                remove,
            };
            ctx.call(new, req, async |mut c, r| {
                c.set_registry_credential(r).await
            })
            .await?
        }
        TenantVerb::WebhookSecret { name } => {
            let req = pb::GetWebhookSecretRequest { tenant: name };
            let secret = ctx
                .call(new, req, async |mut c, r| c.get_webhook_secret(r).await)
                .await?;
            return Ok(ctx.answer(
                || json!({"secret": secret.secret, "key_id": secret.key_id}),
                || format!("{}\n", secret.secret),
            ));
        }
        TenantVerb::List { stale } => {
            let req = pb::ListTenantsRequest { stale };
            let list = ctx
                .call(new, req, async |mut c, r| c.list_tenants(r).await)
                .await?
                .tenants;
            return Ok(ctx.answer_list(&list, tenant_json, list_table));
        }
    };
    Ok(ctx.answer(|| tenant_json(&tenant), || tenant_text(&tenant)))
}

fn webhook_pb(args: WebhookArgs) -> Option<pb::Webhook> {
    args.webhook.map(|url| pb::Webhook {
        url,
        events: args.webhook_on,
    })
}

/// The password in `path`: its first line, without the line break.
fn read_password(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the password file {}: {e}", path.display()))?;
    let password = text.lines().next().unwrap_or_default().to_owned();
    if password.is_empty() {
        return Err(format!("the password file {} is empty", path.display()));
    }
    Ok(password)
}

fn quotas_pb(quotas: Vec<(String, u32, u32)>) -> Vec<pb::GpuQuota> {
    quotas
        .into_iter()
        .map(|(gpu_type, guaranteed, borrow)| pb::GpuQuota {
            gpu_type,
            guaranteed,
            borrow,
        })
        .collect()
}

fn seconds(ms: u64) -> Value {
    json!(ms as f64 / 1000.0)
}

fn tenant_json(t: &pb::Tenant) -> Value {
    let mut v = json!({
        "name": t.name,
        "has_record": t.has_record,
        "quotas": t.quotas.iter().map(|q| json!({
            "gpu_type": q.gpu_type,
            "guaranteed": q.guaranteed,
            "borrow": q.borrow,
        })).collect::<Vec<_>>(),
        "weight": t.weight,
        "default_priority": t.default_priority,
        "max_priority": t.max_priority,
        "max_pending_jobs": t.max_pending_jobs,
        "webhook": t.webhook.as_ref().map(|w| json!({"url": w.url, "events": w.events})),
        "account": account::json(t.account.as_ref()),
        "allowed_mounts": t.allowed_mounts,
        "registry_logins": t.registry_logins.iter().map(|l| json!({
            "registry": l.registry,
            "username": l.username,
            "set_at_ms": l.set_at_ms,
        })).collect::<Vec<_>>(),
        "created_at_ms": t.created_at_ms,
        "updated_at_ms": t.updated_at_ms,
        "pending_jobs": t.pending_jobs,
        "live_jobs": t.live_jobs,
        "usage": t.usage.iter().map(|u| json!({
            "gpu_type": u.gpu_type,
            "gpus_held": u.gpus_held,
            "gpu_seconds": seconds(u.gpu_ms),
            "cluster_gpus": u.cluster_gpus,
        })).collect::<Vec<_>>(),
        "warnings": t.warnings,
    });
    if !t.jobs.is_empty() {
        v["jobs"] = t
            .jobs
            .iter()
            .map(|j| {
                json!({
                    "job_id": j.job_id,
                    "gpu_type": j.gpu_type,
                    "gpu_seconds": seconds(j.gpu_ms),
                })
            })
            .collect();
    }
    v
}

fn quota_text(q: &pb::GpuQuota) -> String {
    format!("{}={}:{}", q.gpu_type, q.guaranteed, q.borrow)
}

fn gpu_hours(ms: u64) -> String {
    format!("{:.2}", ms as f64 / 3_600_000.0)
}

fn list_table(list: &[pb::Tenant]) -> String {
    table_of(
        &[
            "TENANT",
            "QUOTAS (TYPE=G:B)",
            "WEIGHT",
            "PRIORITY",
            "ACCOUNT",
            "GPUS",
            "PENDING",
            "GPU-HOURS",
        ],
        list,
        |t| {
            let quotas: Vec<String> = t.quotas.iter().map(quota_text).collect();
            let held: u32 = t.usage.iter().map(|u| u.gpus_held).sum();
            let ms: u64 = t.usage.iter().map(|u| u.gpu_ms).sum();
            vec![
                t.name.clone(),
                if t.has_record {
                    if quotas.is_empty() {
                        "unlimited".into()
                    } else {
                        quotas.join(",")
                    }
                } else {
                    "unlimited (no record)".into()
                },
                t.weight.to_string(),
                t.default_priority.to_string(),
                account::text(t.account.as_ref()),
                held.to_string(),
                t.pending_jobs.to_string(),
                gpu_hours(ms),
            ]
        },
    )
}

fn tenant_text(t: &pb::Tenant) -> String {
    let mut out = fields(&[
        ("Name", t.name.clone()),
        (
            "Record",
            if t.has_record {
                "yes".into()
            } else {
                "no (unlimited, weight 1, priority 0)".into()
            },
        ),
        ("Weight", t.weight.to_string()),
        ("Default priority", t.default_priority.to_string()),
        ("Max priority", t.max_priority.to_string()),
        (
            "Max pending jobs",
            t.max_pending_jobs
                .map_or_else(|| "no cap".to_owned(), |n| n.to_string()),
        ),
        ("Default account", account::text(t.account.as_ref())),
        (
            "Webhook",
            t.webhook.as_ref().map_or_else(
                || "none".to_owned(),
                |w| match w.events.is_empty() {
                    true => w.url.clone(),
                    false => format!("{} ({})", w.url, w.events.join(",")),
                },
            ),
        ),
        (
            "Allowed mounts",
            if t.allowed_mounts.is_empty() {
                "none".to_owned()
            } else {
                t.allowed_mounts.join(", ")
            },
        ),
        (
            "Registry logins",
            if t.registry_logins.is_empty() {
                "none".to_owned()
            } else {
                let logins: Vec<String> = t
                    .registry_logins
                    .iter()
                    .map(|l| format!("{} ({})", l.registry, l.username))
                    .collect();
                logins.join(", ")
            },
        ),
        ("Pending jobs", t.pending_jobs.to_string()),
        ("Live jobs", t.live_jobs.to_string()),
    ]);
    let quota = |gpu_type: &str| t.quotas.iter().find(|q| q.gpu_type == gpu_type);
    let rows: Vec<Vec<String>> = t
        .usage
        .iter()
        .map(|u| {
            let (g, b) = quota(&u.gpu_type).map_or(("-".into(), "-".into()), |q| {
                (q.guaranteed.to_string(), q.borrow.to_string())
            });
            vec![
                u.gpu_type.clone(),
                g,
                b,
                u.gpus_held.to_string(),
                u.cluster_gpus.to_string(),
                format!("{:.1}", u.gpu_ms as f64 / 1000.0),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&table(
        &[
            "GPU TYPE",
            "GUARANTEED",
            "BORROW",
            "HELD",
            "IN CLUSTER",
            "GPU-SECONDS",
        ],
        &rows,
    ));
    for w in &t.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    if !t.jobs.is_empty() {
        let rows: Vec<Vec<String>> = t
            .jobs
            .iter()
            .map(|j| {
                vec![
                    format!("j-{}", j.job_id),
                    j.gpu_type.clone(),
                    format!("{:.1}", j.gpu_ms as f64 / 1000.0),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&["JOB", "GPU TYPE", "GPU-SECONDS"], &rows));
    }
    out
}
