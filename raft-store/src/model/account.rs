//! The Unix account a job runs as, as the cluster decides it: admins map a token (a user) or a
//! tenant (its default) to an account; the API stamps the submitting token's account (else its
//! tenant's) on the job's spec. The executing node resolves the names through NSS, checks the
//! uid against its allowed range, and fails the job with the reason when the account does not
//! exist there: it never falls back to another account.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// `user[:group]` plus supplementary groups. A part that is all digits is a numeric id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Account {
    /// A user name, or a uid.
    pub user: String,
    /// The primary group (a name or a gid); absent: the user's own primary group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Supplementary groups (names or gids), besides those NSS lists for a named user.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

/// The longest user or group name accepted (glibc's `LOGIN_NAME_MAX` is 256).
const MAX_NAME: usize = 256;

impl Account {
    /// The account without supplementary groups.
    pub fn user(user: &str) -> Self {
        Self {
            user: user.to_owned(),
            group: None,
            groups: Vec::new(),
        }
    }

    /// The user's numeric uid, when it was given as one.
    pub fn uid(&self) -> Option<u32> {
        numeric(&self.user)
    }

    /// Whether the account is root by name or uid: never mapped through the cluster (a node's
    /// operator may still set `jobs.run_as = "root"` in its own configuration).
    pub fn is_root(&self) -> bool {
        self.user == "root" || self.uid() == Some(0)
    }

    /// The rules every account obeys before it reaches the state.
    pub fn validate(&self) -> Result<(), String> {
        check_name("user", &self.user)?;
        if let Some(g) = &self.group {
            check_name("group", g)?;
        }
        for g in &self.groups {
            check_name("supplementary group", g)?;
        }
        if self.is_root() {
            return Err(format!(
                "account {self}: jobs never run as root through the cluster; a node's operator \
                 may set jobs.run_as = \"root\" in that node's agent.toml"
            ));
        }
        Ok(())
    }
}

fn numeric(part: &str) -> Option<u32> {
    (!part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
        .then(|| part.parse().ok())
        .flatten()
}

/// A name NSS could hold: not empty, not too long, no whitespace, control characters, `:` or
/// `,`, not starting with `-`; all digits only if it fits a 32-bit id other than 2^32-1 (-1).
fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("the {what} of an account must not be empty"));
    }
    if name.len() > MAX_NAME {
        return Err(format!("{what} name longer than {MAX_NAME} bytes"));
    }
    if name.starts_with('-')
        || name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == ':' || c == ',')
    {
        return Err(format!(
            "{what} {name:?} is not a valid user or group name (no whitespace, ':' or ',', no leading '-')"
        ));
    }
    if name.bytes().all(|b| b.is_ascii_digit()) && numeric(name).is_none_or(|id| id == u32::MAX) {
        return Err(format!("{what} id {name} is out of range"));
    }
    Ok(())
}

impl fmt::Display for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.user)?;
        if let Some(g) = &self.group {
            write!(f, ":{g}")?;
        }
        if !self.groups.is_empty() {
            write!(f, " (+{})", self.groups.join(","))?;
        }
        Ok(())
    }
}

/// `user`, `user:group`, `uid:gid` (supplementary groups are given separately).
impl FromStr for Account {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (user, group) = match s.split_once(':') {
            Some((u, g)) => (u, Some(g.to_owned())),
            None => (s, None),
        };
        let account = Self {
            user: user.to_owned(),
            group,
            groups: Vec::new(),
        };
        account.validate()?;
        Ok(account)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_parse_and_print() {
        let a: Account = "alice".parse().expect("name");
        assert_eq!(a, Account::user("alice"));
        assert_eq!(a.uid(), None);
        let b: Account = "1001:2000".parse().expect("ids");
        assert_eq!(b.uid(), Some(1001));
        assert_eq!(b.group.as_deref(), Some("2000"));
        assert_eq!(b.to_string(), "1001:2000");
        let c = Account {
            groups: vec!["video".into(), "research".into()],
            ..Account::user("carol")
        };
        assert_eq!(c.to_string(), "carol (+video,research)");
    }

    #[test]
    fn bad_accounts_are_refused_with_the_reason() {
        for (input, says) in [
            ("", "must not be empty"),
            (":staff", "must not be empty"),
            ("alice:", "must not be empty"),
            ("al ice", "not a valid"),
            ("-rf", "not a valid"),
            ("a:b:c", "not a valid"),
            ("4294967295", "out of range"),
            ("99999999999", "out of range"),
            ("root", "never run as root"),
            ("0", "never run as root"),
            ("0:0", "never run as root"),
        ] {
            let err = input.parse::<Account>().expect_err(input);
            assert!(err.contains(says), "{input:?}: {err}");
        }
        let long = "x".repeat(MAX_NAME + 1);
        assert!(long.parse::<Account>().is_err());
        let bad_group = Account {
            groups: vec!["a,b".into()],
            ..Account::user("alice")
        };
        assert!(bad_group.validate().is_err());
        // Group 0 is a group like any other; only the user decides root.
        assert!("alice:0".parse::<Account>().is_ok());
    }
}
