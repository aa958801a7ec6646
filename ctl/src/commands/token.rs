//! `gpuctl token create|list|set-account|revoke|whoami`.
//!
//! JSON (stable): a token is `{"id", "role" ("admin"|"operator"|"tenant-admin"|"user"|"viewer"),
//! "tenant" (null when cluster-wide), "description", "created_at_ms", "created_by", "revoked",
//! "account" (the Unix account its jobs run as: null, or `{"user", "group", "groups"}`),
//! "expires_at_ms" (null: until revoked), "uses_left" (a join token's enrolments left; null:
//! unlimited), "node_ids" (`[first, last]` a join token may enrol; null: any), "seat" (a join
//! token's `voter`, `learner` or `edge`; null: any)}`;
//! `list`, `set-account`, `revoke` and `whoami` print an array of them (one for the last
//! three); `create` prints `{"token": <token>, "bearer": "<id>.<secret>"}`.

use gpu_proto::v1 as pb;
use gpu_proto::v1::token_service_client::TokenServiceClient;
use serde_json::{Value, json};

use super::{Answer, Ctx, Failure, account};
use crate::cli::{RoleArg, TokenVerb};
use crate::output::table_of;
use crate::units::rfc3339;

pub(crate) async fn run(ctx: &Ctx, verb: TokenVerb) -> Result<Answer, Failure> {
    let new = TokenServiceClient::new;
    let token = match verb {
        TokenVerb::Create {
            role,
            tenant,
            description,
            account,
            ttl,
            uses,
            node_ids,
            seat,
        } => {
            let (node_id_first, node_id_last) = node_ids.unwrap_or_default();
            let req = pb::CreateTokenRequest {
                role: role_pb(role) as i32,
                tenant: tenant.unwrap_or_default(),
                description,
                account: account::from_args(account),
                ttl_s: ttl,
                uses,
                node_id_first,
                node_id_last,
                seat: seat.unwrap_or_default(),
            };
            let reply = ctx
                .call(new, req, async |mut c, r| c.create_token(r).await)
                .await?;
            let token = reply.token.unwrap_or_default();
            return Ok(ctx.answer(
                || json!({ "token": token_json(&token), "bearer": reply.bearer }),
                || {
                    eprintln!(
                        "created {} ({}); the secret below is shown only once",
                        token.id,
                        role_name(token.role)
                    );
                    format!("{}\n", reply.bearer)
                },
            ));
        }
        TokenVerb::List => {
            let req = pb::ListTokensRequest {};
            let tokens = ctx
                .call(new, req, async |mut c, r| c.list_tokens(r).await)
                .await?
                .tokens;
            return Ok(render(ctx, &tokens));
        }
        TokenVerb::SetAccount {
            id,
            account: user,
            groups,
            clear,
        } => {
            let req = pb::SetTokenAccountRequest {
                id,
                account: user.map(|u| account::to_pb(u, groups)),
                clear,
            };
            ctx.call(new, req, async |mut c, r| c.set_token_account(r).await)
                .await?
        }
        TokenVerb::Revoke { id } => {
            let req = pb::RevokeTokenRequest { id };
            ctx.call(new, req, async |mut c, r| c.revoke_token(r).await)
                .await?
        }
        TokenVerb::Whoami => {
            let req = pb::WhoAmIRequest {};
            ctx.call(new, req, async |mut c, r| c.who_am_i(r).await)
                .await?
        }
    };
    Ok(render(ctx, std::slice::from_ref(&token)))
}

fn role_pb(r: RoleArg) -> pb::Role {
    match r {
        RoleArg::Admin => pb::Role::Admin,
        RoleArg::Operator => pb::Role::Operator,
        RoleArg::TenantAdmin => pb::Role::TenantAdmin,
        RoleArg::User => pb::Role::User,
        RoleArg::Viewer => pb::Role::Viewer,
        RoleArg::Node => pb::Role::Node,
    }
}

fn role_name(r: i32) -> &'static str {
    match pb::Role::try_from(r) {
        Ok(pb::Role::Admin) => "admin",
        Ok(pb::Role::Operator) => "operator",
        Ok(pb::Role::TenantAdmin) => "tenant-admin",
        Ok(pb::Role::User) => "user",
        Ok(pb::Role::Viewer) => "viewer",
        Ok(pb::Role::Node) => "node",
        _ => "unknown",
    }
}

fn token_json(t: &pb::Token) -> Value {
    json!({
        "id": t.id,
        "role": role_name(t.role),
        "tenant": (!t.tenant.is_empty()).then_some(&t.tenant),
        "description": t.description,
        "created_at_ms": t.created_at_ms,
        "created_by": t.created_by,
        "revoked": t.revoked,
        "account": account::json(t.account.as_ref()),
        "expires_at_ms": t.expires_at_ms,
        "uses_left": t.uses_left,
        "node_ids": (t.node_id_first > 0).then_some([t.node_id_first, t.node_id_last]),
        "seat": (!t.seat.is_empty()).then_some(&t.seat),
    })
}

/// Tokens as a JSON array or a table: what every verb but `create` prints.
fn render(ctx: &Ctx, tokens: &[pb::Token]) -> Answer {
    ctx.answer_list(tokens, token_json, tokens_table)
}

/// `revoked`, `used up`, `expired`, or `active` with its limits.
fn state(t: &pb::Token) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    if t.revoked {
        return "revoked".into();
    }
    if t.uses_left == Some(0) {
        return "used up".into();
    }
    match t.expires_at_ms {
        Some(at) if at <= now => "expired".into(),
        Some(at) => format!("active until {}", rfc3339(at)),
        None => "active".into(),
    }
}

fn tokens_table(tokens: &[pb::Token]) -> String {
    table_of(
        &[
            "ID",
            "ROLE",
            "TENANT",
            "ACCOUNT",
            "STATE",
            "CREATED BY",
            "DESCRIPTION",
        ],
        tokens,
        |t| {
            vec![
                t.id.clone(),
                role_name(t.role).to_owned(),
                if t.tenant.is_empty() {
                    "-".into()
                } else {
                    t.tenant.clone()
                },
                account::text(t.account.as_ref()),
                state(t),
                t.created_by.clone(),
                t.description.clone(),
            ]
        },
    )
}
