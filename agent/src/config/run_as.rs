//! The user jobs run as (`jobs.run_as`, `jobs.run_as_by_tenant`), resolved against this
//! host's users when the configuration is validated; never root unless asked for by name.
//! Also the uids a cluster-mapped account may have on this node (`jobs.uid_range`).

use std::fmt;
use std::str::FromStr;

use anyhow::{Context, ensure};

/// The user jobs run as, resolved to ids when the configuration is validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl RunAs {
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// `jobs.run_as` (or its default) resolved against this host's users and the agent's own
    /// effective ids.
    pub(super) fn resolve(requested: Option<&str>) -> anyhow::Result<Self> {
        use nix::unistd::{Uid, User, getegid, geteuid};
        let (uid, gid) = (geteuid().as_raw(), getegid().as_raw());
        let own_name = User::from_uid(Uid::from_raw(uid))
            .ok()
            .flatten()
            .map_or_else(|| uid.to_string(), |u| u.name);
        let lookup = |name: &str| -> anyhow::Result<Option<(u32, u32)>> {
            let user =
                User::from_name(name).with_context(|| format!("looking up user {name:?}"))?;
            Ok(user.map(|u| (u.uid.as_raw(), u.gid.as_raw())))
        };
        choose_run_as(requested, (uid, gid, &own_name), lookup)
    }
}

/// The pure part of `RunAs::resolve`: `agent` is the agent's own (uid, gid, name), `lookup`
/// finds a user's (uid, primary gid) by name.
fn choose_run_as(
    requested: Option<&str>,
    agent: (u32, u32, &str),
    lookup: impl Fn(&str) -> anyhow::Result<Option<(u32, u32)>>,
) -> anyhow::Result<RunAs> {
    let (agent_uid, agent_gid, agent_name) = agent;
    let Some(name) = requested else {
        if agent_uid != 0 {
            return Ok(RunAs {
                name: agent_name.to_owned(),
                uid: agent_uid,
                gid: agent_gid,
            });
        }
        let (uid, gid) = lookup("nobody")?.context(
            "jobs.run_as is not set and this host has no user \"nobody\" to run jobs as; \
             set jobs.run_as to an unprivileged user",
        )?;
        return Ok(RunAs {
            name: "nobody".into(),
            uid,
            gid,
        });
    };
    ensure!(!name.is_empty(), "jobs.run_as must name a user");
    let (uid, gid) =
        lookup(name)?.with_context(|| format!("jobs.run_as: this host has no user {name:?}"))?;
    if agent_uid == 0 {
        return Ok(RunAs {
            name: name.to_owned(),
            uid,
            gid,
        });
    }
    ensure!(
        uid == agent_uid,
        "jobs.run_as = {name:?} (uid {uid}) needs the agent to run as root; it runs as uid {agent_uid}"
    );
    // Not root: jobs keep the agent's own ids (it could not switch to the user's primary group).
    Ok(RunAs {
        name: name.to_owned(),
        uid,
        gid: agent_gid,
    })
}

/// The uids a job may run as when the cluster maps it to an account (`jobs.uid_range`,
/// `first-last`, both included): by default the regular users of `useradd` (1000-60000), so a
/// mapping can never make a job a system account. It never includes 0. The node's own
/// `jobs.run_as` users are chosen by its operator and not held to it (`nobody` is 65534).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

impl Default for UidRange {
    fn default() -> Self {
        Self {
            first: 1000,
            last: 60000,
        }
    }
}

impl UidRange {
    pub fn contains(&self, uid: u32) -> bool {
        (self.first..=self.last).contains(&uid)
    }
}

impl fmt::Display for UidRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl FromStr for UidRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage =
            || format!("jobs.uid_range must be FIRST-LAST (e.g. \"1000-60000\"), got {s:?}");
        let (first, last) = s.trim().split_once('-').ok_or_else(usage)?;
        let id = |part: &str| part.trim().parse::<u32>().map_err(|_| usage());
        let range = Self {
            first: id(first)?,
            last: id(last)?,
        };
        if range.first == 0 {
            return Err(format!(
                "jobs.uid_range {range} includes uid 0: jobs never run as root through the cluster"
            ));
        }
        if range.first > range.last {
            return Err(format!("jobs.uid_range {range} is empty (first > last)"));
        }
        Ok(range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_ranges_parse_and_refuse_root_and_empty_ranges() {
        assert_eq!(UidRange::default().to_string(), "1000-60000");
        let r: UidRange = " 2000 - 2999 ".parse().expect("range");
        assert_eq!(
            r,
            UidRange {
                first: 2000,
                last: 2999
            }
        );
        assert!(r.contains(2000) && r.contains(2999));
        assert!(!r.contains(1999) && !r.contains(3000));
        let one: UidRange = "5000-5000".parse().expect("one uid");
        assert!(one.contains(5000));
        for (input, says) in [
            ("0-60000", "includes uid 0"),
            ("3000-2000", "is empty"),
            ("1000", "FIRST-LAST"),
            ("a-b", "FIRST-LAST"),
            ("-5-10", "FIRST-LAST"),
            ("1000-99999999999", "FIRST-LAST"),
        ] {
            let err = input.parse::<UidRange>().expect_err(input);
            assert!(err.contains(says), "{input:?}: {err}");
        }
    }

    fn users(name: &str) -> anyhow::Result<Option<(u32, u32)>> {
        Ok(match name {
            "root" => Some((0, 0)),
            "nobody" => Some((65534, 65534)),
            "alice" => Some((1000, 1000)),
            _ => None,
        })
    }

    #[test]
    fn jobs_never_run_as_root_by_default() {
        let root = (0, 0, "root");
        let alice = (1000, 1001, "alice");
        let pick = |requested, agent| choose_run_as(requested, agent, users);
        let nobody = RunAs {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
        };
        assert_eq!(pick(None, root).expect("default"), nobody);
        assert_eq!(pick(Some("nobody"), root).expect("named"), nobody);
        // An unprivileged agent runs jobs as itself, with its own group.
        let own = RunAs {
            name: "alice".into(),
            uid: 1000,
            gid: 1001,
        };
        assert_eq!(pick(None, alice).expect("own user"), own);
        assert_eq!(pick(Some("alice"), alice).expect("same user"), own);
        // Root only when asked for by name.
        assert!(pick(Some("root"), root).expect("explicit root").is_root());
    }

    #[test]
    fn impossible_run_as_users_are_config_errors() {
        let err = choose_run_as(Some("mallory"), (0, 0, "root"), users).expect_err("unknown");
        assert!(err.to_string().contains("no user \"mallory\""), "{err}");
        let err =
            choose_run_as(Some("nobody"), (1000, 1000, "alice"), users).expect_err("not root");
        assert!(
            err.to_string().contains("needs the agent to run as root"),
            "{err}"
        );
        assert!(choose_run_as(Some(""), (0, 0, "root"), users).is_err());
        let no_nobody = |_: &str| Ok(None);
        let err = choose_run_as(None, (0, 0, "root"), no_nobody).expect_err("no nobody");
        assert!(err.to_string().contains("jobs.run_as"), "{err}");
    }
}
