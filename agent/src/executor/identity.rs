//! Who a job runs as on this node, and how its process becomes that user.
//!
//! A job whose spec carries an `Account` (the cluster's decision) runs as that account,
//! resolved here through NSS (so LDAP/SSSD users work like local ones): a named user's
//! supplementary groups are those NSS lists for it (`getgrouplist`, as `initgroups` does at a
//! login) plus the account's own; a uid outside `jobs.uid_range`, uid 0, or a user or group
//! this node does not know fails the run with the reason. It never falls back to another
//! account: a job that cannot be itself does not run. A job without an account runs as the
//! node's `jobs.run_as_by_tenant` / `jobs.run_as` user, without supplementary groups.
//!
//! `resolve` is the pure decision over a `UserDb`; `Nss` is the thin shell over the host's
//! user database. `Switch` and `become_in_child` are the supervisor's side: groups, gid, uid
//! and working directory set in the forked child, in that order, before `exec`.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use gpu_raft_store::{Account, NodeId};
use nix::errno::Errno;
use nix::unistd::{Gid, Group, Uid, User};

use crate::config::{RunAs, UidRange};

/// The user a run's job process becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    /// The user name (`USER`, `LOGNAME`).
    pub(crate) name: String,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// Supplementary groups, sorted, without duplicates (empty: none).
    pub(crate) groups: Vec<u32>,
    /// The passwd home (`HOME`); `None` for the node's own job users, whose `HOME` is the
    /// run's `work/` directory (`nobody`'s home does not exist).
    pub(crate) home: Option<PathBuf>,
    /// The passwd login shell (`SHELL`), when known.
    pub(crate) shell: Option<PathBuf>,
}

impl Identity {
    /// A node-configured job user (`jobs.run_as`): its ids only, as configured.
    pub(crate) fn of_run_as(user: &RunAs) -> Self {
        Self {
            name: user.name.clone(),
            uid: user.uid,
            gid: user.gid,
            groups: Vec::new(),
            home: None,
            shell: None,
        }
    }
}

/// A user as the decision needs it from passwd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Passwd {
    pub(crate) name: String,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) home: PathBuf,
    pub(crate) shell: PathBuf,
}

/// The user database; `Err` is a failed lookup (NSS unreachable), `Ok(None)` a name or id
/// that does not exist.
pub(crate) trait UserDb {
    fn user_by_name(&self, name: &str) -> Result<Option<Passwd>, String>;
    fn user_by_uid(&self, uid: u32) -> Result<Option<Passwd>, String>;
    /// A group's gid, by name.
    fn group_by_name(&self, name: &str) -> Result<Option<u32>, String>;
    /// Whether a group with this gid exists.
    fn group_exists(&self, gid: u32) -> Result<bool, String>;
    /// Every group `user` is a member of, with `primary` (what `initgroups` would set).
    fn group_list(&self, user: &str, primary: u32) -> Result<Vec<u32>, String>;
}

/// The account `account` on node `node`, or why a job cannot run as it here. `range` is
/// `jobs.uid_range`; `agent_uid` the agent's own uid (only root can become another user).
pub(crate) fn resolve(
    account: &Account,
    db: &impl UserDb,
    range: UidRange,
    node: NodeId,
    agent_uid: u32,
) -> Result<Identity, String> {
    let user = &account.user;
    let on = format!("on node n{node}");
    if account.is_root() {
        return Err(format!(
            "account {user}: jobs never run as root through the cluster"
        ));
    }
    let lookup = |what: &str, e: String| format!("looking up {what} {user:?} {on}: {e}");
    let found = match account.uid() {
        Some(uid) => db.user_by_uid(uid).map_err(|e| lookup("uid", e))?,
        None => db.user_by_name(user).map_err(|e| lookup("user", e))?,
    };
    let Some(pw) = found else {
        return Err(format!("account {user} does not exist {on}"));
    };
    if pw.uid == 0 {
        return Err(format!(
            "account {user} is uid 0 (root) {on}: jobs never run as root through the cluster"
        ));
    }
    if !range.contains(pw.uid) {
        return Err(format!(
            "account {user} is uid {} {on}, outside its jobs.uid_range {range}",
            pw.uid
        ));
    }
    if agent_uid != 0 && pw.uid != agent_uid {
        return Err(format!(
            "account {user} is uid {} {on}, whose agent runs as uid {agent_uid}, not root: it \
             can run jobs only as itself",
            pw.uid
        ));
    }
    let group = |name: &str| -> Result<u32, String> {
        let missing = || format!("group {name} of account {user} does not exist {on}");
        let looked = |e: String| format!("looking up group {name:?} {on}: {e}");
        match numeric(name) {
            Some(gid) => db
                .group_exists(gid)
                .map_err(looked)?
                .then_some(gid)
                .ok_or_else(missing),
            None => db.group_by_name(name).map_err(looked)?.ok_or_else(missing),
        }
    };
    let gid = match &account.group {
        Some(g) => group(g)?,
        None => pw.gid,
    };
    // A named user gets what a login would give it; a numeric one exactly what the account
    // lists (its mapping spelled out ids, not a user to look up).
    let mut groups = if account.uid().is_none() {
        db.group_list(&pw.name, gid)
            .map_err(|e| format!("listing the groups of {user} {on}: {e}"))?
    } else {
        Vec::new()
    };
    for g in &account.groups {
        groups.push(group(g)?);
    }
    groups.sort_unstable();
    groups.dedup();
    Ok(Identity {
        name: pw.name,
        uid: pw.uid,
        gid,
        groups,
        home: Some(pw.home),
        shell: Some(pw.shell),
    })
}

fn numeric(id: &str) -> Option<u32> {
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
        .then(|| id.parse().ok())
        .flatten()
}

/// The host's user database through NSS (`getpwnam_r`, `getpwuid_r`, `getgrnam_r`,
/// `getgrgid_r`, `getgrouplist`). These calls may block on a remote directory: call them off
/// the async executor.
pub(crate) struct Nss;

/// Not found: glibc returns 0 with no entry, but NSS modules may also say ENOENT or ESRCH
/// (getpwnam_r(3)).
fn absent<T>(r: nix::Result<Option<T>>) -> Result<Option<T>, String> {
    match r {
        Ok(found) => Ok(found),
        Err(Errno::ENOENT | Errno::ESRCH) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

fn passwd(u: User) -> Passwd {
    Passwd {
        name: u.name,
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
        home: u.dir,
        shell: u.shell,
    }
}

impl UserDb for Nss {
    fn user_by_name(&self, name: &str) -> Result<Option<Passwd>, String> {
        Ok(absent(User::from_name(name))?.map(passwd))
    }

    fn user_by_uid(&self, uid: u32) -> Result<Option<Passwd>, String> {
        Ok(absent(User::from_uid(Uid::from_raw(uid)))?.map(passwd))
    }

    fn group_by_name(&self, name: &str) -> Result<Option<u32>, String> {
        Ok(absent(Group::from_name(name))?.map(|g| g.gid.as_raw()))
    }

    fn group_exists(&self, gid: u32) -> Result<bool, String> {
        Ok(absent(Group::from_gid(Gid::from_raw(gid)))?.is_some())
    }

    fn group_list(&self, user: &str, primary: u32) -> Result<Vec<u32>, String> {
        let name = CString::new(user).map_err(|e| e.to_string())?;
        let groups =
            nix::unistd::getgrouplist(&name, Gid::from_raw(primary)).map_err(|e| e.to_string())?;
        Ok(groups.into_iter().map(Gid::as_raw).collect())
    }
}

/// What the supervisor does to become the job's user in the child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Switch {
    /// Set these supplementary groups, then gid, then uid (the supervisor is root).
    To {
        uid: u32,
        gid: u32,
        groups: Vec<u32>,
    },
    /// The job runs with the supervisor's own ids (it is not root, and the job's user is its
    /// own; it could not change groups anyway).
    Stay,
}

/// How a supervisor running as `euid` starts a job meant to run as `target`
/// (`(uid, gid, groups)`; `None`: as the supervisor itself).
pub(crate) fn switch_for(target: Option<(u32, u32, &[u32])>, euid: u32) -> Result<Switch, String> {
    match target {
        None => Ok(Switch::Stay),
        Some((uid, gid, groups)) if euid == 0 => Ok(Switch::To {
            uid,
            gid,
            groups: groups.to_vec(),
        }),
        Some((uid, _, _)) if uid == euid => Ok(Switch::Stay),
        Some((uid, _, _)) => Err(format!(
            "the supervisor runs as uid {euid}, not root: it cannot start the job as uid {uid}"
        )),
    }
}

/// Make the child of `cmd`, after the fork and before `exec`, drop to `switch` and then enter
/// `cwd` as that user (so a directory the user may not enter fails the start instead of being
/// entered with root's rights, which is what `Command::current_dir` would do: std changes
/// directory before it runs `pre_exec` hooks). Everything is prepared here, before the fork:
/// the hook itself only makes async-signal-safe system calls, allocates nothing and takes no
/// lock. Do not also use `Command::uid`/`gid`/`current_dir`: std applies those before the hook.
#[allow(unsafe_code)]
pub(crate) fn become_in_child(
    cmd: &mut tokio::process::Command,
    switch: Switch,
    cwd: &Path,
) -> Result<(), String> {
    let cwd = CString::new(cwd.as_os_str().as_bytes())
        .map_err(|_| format!("working directory {} contains a NUL byte", cwd.display()))?;
    let ids = match switch {
        Switch::To { uid, gid, groups } => Some((
            Uid::from_raw(uid),
            Gid::from_raw(gid),
            groups.into_iter().map(Gid::from_raw).collect::<Vec<_>>(),
        )),
        Switch::Stay => None,
    };
    let hook = move || -> std::io::Result<()> {
        if let Some((uid, gid, groups)) = &ids {
            // Groups first: after setgid/setuid the process no longer may set them.
            nix::unistd::setgroups(groups)?;
            nix::unistd::setgid(*gid)?;
            nix::unistd::setuid(*uid)?;
        }
        // SAFETY: chdir(2) reads the NUL-terminated path the `CString` owns.
        Errno::result(unsafe { nix::libc::chdir(cwd.as_ptr()) })?;
        Ok(())
    };
    // SAFETY: `pre_exec` runs `hook` in the forked child of a possibly multi-threaded process,
    // where only async-signal-safe functions may be called. `hook` calls setgroups(2),
    // setgid(2), setuid(2) (nix's direct wrappers) and chdir(2) on data the closure owns (a
    // `Vec<Gid>` read as a slice, a `CString`), and its errors are plain errnos
    // (`io::Error::from_raw_os_error`): no allocation, no lock, no stdio.
    unsafe {
        cmd.pre_exec(hook);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A user database in a table: users (name, uid, gid), groups (name, gid, members).
    struct Table {
        users: Vec<(&'static str, u32, u32)>,
        groups: Vec<(&'static str, u32, Vec<&'static str>)>,
        down: bool,
    }

    impl Table {
        fn site() -> Self {
            Self {
                users: vec![
                    ("alice", 1001, 1001),
                    ("bob", 1002, 1002),
                    ("toor", 0, 0),
                    ("svc", 500, 500),
                    ("far", 70000, 70000),
                ],
                groups: vec![
                    ("alice", 1001, vec![]),
                    ("bob", 1002, vec![]),
                    ("video", 44, vec!["alice"]),
                    ("research", 3000, vec!["alice", "bob"]),
                    ("scratch", 3001, vec![]),
                ],
                down: false,
            }
        }

        fn pw(&self, (name, uid, gid): (&str, u32, u32)) -> Passwd {
            Passwd {
                name: name.into(),
                uid,
                gid,
                home: format!("/home/{name}").into(),
                shell: "/bin/bash".into(),
            }
        }

        fn check(&self) -> Result<(), String> {
            if self.down {
                Err("Connection refused".into())
            } else {
                Ok(())
            }
        }
    }

    impl UserDb for Table {
        fn user_by_name(&self, name: &str) -> Result<Option<Passwd>, String> {
            self.check()?;
            Ok(self.users.iter().find(|u| u.0 == name).map(|u| self.pw(*u)))
        }
        fn user_by_uid(&self, uid: u32) -> Result<Option<Passwd>, String> {
            self.check()?;
            Ok(self.users.iter().find(|u| u.1 == uid).map(|u| self.pw(*u)))
        }
        fn group_by_name(&self, name: &str) -> Result<Option<u32>, String> {
            self.check()?;
            Ok(self.groups.iter().find(|g| g.0 == name).map(|g| g.1))
        }
        fn group_exists(&self, gid: u32) -> Result<bool, String> {
            self.check()?;
            Ok(self.groups.iter().any(|g| g.1 == gid))
        }
        fn group_list(&self, user: &str, primary: u32) -> Result<Vec<u32>, String> {
            self.check()?;
            let mut list = vec![primary];
            list.extend(
                self.groups
                    .iter()
                    .filter(|g| g.2.contains(&user))
                    .map(|g| g.1),
            );
            Ok(list)
        }
    }

    fn account(user: &str, group: Option<&str>, groups: &[&str]) -> Account {
        Account {
            user: user.into(),
            group: group.map(Into::into),
            groups: groups.iter().map(|g| (*g).into()).collect(),
        }
    }

    fn resolve_on_n3(a: &Account) -> Result<Identity, String> {
        resolve(a, &Table::site(), UidRange::default(), 3, 0)
    }

    #[test]
    fn a_named_account_gets_its_login_groups_home_and_shell() {
        let alice = resolve_on_n3(&account("alice", None, &["scratch"])).expect("alice");
        assert_eq!(
            alice,
            Identity {
                name: "alice".into(),
                uid: 1001,
                gid: 1001,
                groups: vec![44, 1001, 3000, 3001],
                home: Some("/home/alice".into()),
                shell: Some("/bin/bash".into()),
            }
        );
        // Another primary group; supplementary groups by gid.
        let bob = resolve_on_n3(&account("bob", Some("research"), &["44"])).expect("bob");
        assert_eq!((bob.gid, bob.groups), (3000, vec![44, 3000]));
    }

    #[test]
    fn a_numeric_account_gets_exactly_its_listed_ids() {
        let by_id = resolve_on_n3(&account("1002", Some("3000"), &["3001"])).expect("ids");
        assert_eq!(by_id.name, "bob", "the name comes from passwd");
        assert_eq!(
            (by_id.uid, by_id.gid, by_id.groups),
            (1002, 3000, vec![3001])
        );
        let own_group = resolve_on_n3(&account("1001", None, &[])).expect("uid only");
        assert_eq!((own_group.gid, own_group.groups), (1001, vec![]));
    }

    #[test]
    fn an_account_this_node_cannot_be_fails_with_the_reason() {
        let fails = |a: Account| resolve_on_n3(&a).expect_err(&a.to_string());
        let cases = BTreeMap::from([
            ("mallory", fails(account("mallory", None, &[]))),
            ("uid 4242", fails(account("4242", None, &[]))),
            ("group", fails(account("alice", Some("wheel"), &[]))),
            ("gid", fails(account("alice", Some("999"), &[]))),
            ("supplementary", fails(account("alice", None, &["nope"]))),
            ("root by uid", fails(account("toor", None, &[]))),
            ("root by name", fails(account("root", None, &[]))),
            ("system user", fails(account("svc", None, &[]))),
            ("beyond", fails(account("far", None, &[]))),
        ]);
        let text = cases
            .iter()
            .map(|(k, v)| format!("{k}: {v}\n"))
            .collect::<String>();
        expect_test::expect![[r#"
            beyond: account far is uid 70000 on node n3, outside its jobs.uid_range 1000-60000
            gid: group 999 of account alice does not exist on node n3
            group: group wheel of account alice does not exist on node n3
            mallory: account mallory does not exist on node n3
            root by name: account root: jobs never run as root through the cluster
            root by uid: account toor is uid 0 (root) on node n3: jobs never run as root through the cluster
            supplementary: group nope of account alice does not exist on node n3
            system user: account svc is uid 500 on node n3, outside its jobs.uid_range 1000-60000
            uid 4242: account 4242 does not exist on node n3
        "#]]
        .assert_eq(&text);
    }

    #[test]
    fn a_failed_lookup_is_not_a_missing_user_and_nothing_falls_back() {
        let down = Table {
            down: true,
            ..Table::site()
        };
        let err = resolve(
            &account("alice", None, &[]),
            &down,
            UidRange::default(),
            3,
            0,
        )
        .expect_err("directory down");
        assert_eq!(
            err,
            "looking up user \"alice\" on node n3: Connection refused"
        );
        // An unprivileged agent can run jobs only as itself.
        let err = resolve(
            &account("alice", None, &[]),
            &Table::site(),
            UidRange::default(),
            3,
            1002,
        )
        .expect_err("not root");
        assert!(err.contains("agent runs as uid 1002, not root"), "{err}");
        let own = resolve(
            &account("bob", None, &[]),
            &Table::site(),
            UidRange::default(),
            3,
            1002,
        )
        .expect("itself");
        assert_eq!(own.uid, 1002);
        // A narrower range refuses what the default accepts.
        let narrow = UidRange {
            first: 1002,
            last: 1999,
        };
        let err = resolve(&account("alice", None, &[]), &Table::site(), narrow, 3, 0)
            .expect_err("outside");
        assert!(
            err.ends_with("outside its jobs.uid_range 1002-1999"),
            "{err}"
        );
    }

    #[test]
    fn only_root_switches_and_a_plain_supervisor_runs_jobs_as_itself() {
        assert_eq!(
            switch_for(Some((1001, 1001, &[44])), 0),
            Ok(Switch::To {
                uid: 1001,
                gid: 1001,
                groups: vec![44]
            })
        );
        assert_eq!(switch_for(None, 0), Ok(Switch::Stay));
        assert_eq!(switch_for(Some((1001, 1001, &[])), 1001), Ok(Switch::Stay));
        let err = switch_for(Some((1001, 1001, &[])), 1002).expect_err("not root");
        assert!(err.contains("cannot start the job as uid 1001"), "{err}");
    }

    #[test]
    fn the_host_database_answers_for_root_and_not_for_strangers() {
        let root = Nss.user_by_uid(0).expect("nss").expect("root exists");
        assert_eq!(root.name, "root");
        assert_eq!(Nss.user_by_name("gpumesh-no-such-user").expect("nss"), None);
        assert!(Nss.group_exists(0).expect("nss"));
        assert_eq!(
            Nss.group_by_name("gpumesh-no-such-group").expect("nss"),
            None
        );
        assert!(Nss.group_list("root", 0).expect("nss").contains(&0));
    }
}
