//! Unix accounts (who a token's or tenant's jobs run as): from the flags to the request, and
//! as text and stable JSON (`null`, or `{"user", "group" (null: the user's own), "groups"}`).

use gpu_proto::v1 as pb;
use serde_json::{Value, json};

use crate::args::AccountArg;
use crate::cli::AccountArgs;

/// The account `USER[:GROUP]` with its supplementary groups, as the API takes it.
pub(super) fn to_pb(arg: AccountArg, groups: Vec<String>) -> pb::Account {
    pb::Account {
        user: arg.user,
        group: arg.group.unwrap_or_default(),
        groups,
    }
}

/// `--account` and `--groups`, when an account was given.
pub(super) fn from_args(args: AccountArgs) -> Option<pb::Account> {
    args.account.map(|a| to_pb(a, args.groups))
}

/// `bob:research (+video,1007)`, or `-` when there is none.
pub(super) fn text(a: Option<&pb::Account>) -> String {
    let Some(a) = a else {
        return "-".into();
    };
    let mut out = a.user.clone();
    if !a.group.is_empty() {
        out.push(':');
        out.push_str(&a.group);
    }
    if !a.groups.is_empty() {
        out.push_str(&format!(" (+{})", a.groups.join(",")));
    }
    out
}

pub(super) fn json(a: Option<&pb::Account>) -> Value {
    a.map_or(Value::Null, |a| {
        json!({
            "user": a.user,
            "group": (!a.group.is_empty()).then_some(&a.group),
            "groups": a.groups,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_read_naturally() {
        let bob = pb::Account {
            user: "bob".into(),
            group: "research".into(),
            groups: vec!["video".into(), "1007".into()],
        };
        assert_eq!(text(Some(&bob)), "bob:research (+video,1007)");
        assert_eq!(text(None), "-");
        let alice = to_pb(
            AccountArg {
                user: "alice".into(),
                group: None,
            },
            vec![],
        );
        assert_eq!(text(Some(&alice)), "alice");
        assert_eq!(
            json(Some(&alice)),
            json!({"user": "alice", "group": null, "groups": []})
        );
        assert_eq!(json(Some(&bob))["group"], "research");
        assert_eq!(json(None), Value::Null);
    }
}
