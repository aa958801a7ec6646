//! Jobs run as the Unix account the cluster decided (`JobSpec::account`), through the real
//! `gpu-agent shim` started exactly as the executor starts it (`prepare_run`, then
//! `supervisor_command`), with real users and groups this test creates (`useradd`, `groupadd`)
//! and removes again even when it fails:
//!
//! - two accounts' jobs run as their users, in their homes, and cannot read each other's
//!   environment or signal each other; no job process is root, the supervisor's environment is
//!   PATH and LANG only, and the job's environment file is out of the jobs' reach;
//! - supplementary groups are the user's (NSS) plus the account's; a numeric account gets
//!   exactly its ids;
//! - an account or group this node does not know, a uid outside `jobs.uid_range`, or a
//!   relative workdir fails the start with the reason, and nothing runs; a workdir is entered
//!   as the job's user (one only root may enter fails the start);
//! - a job's `LD_PRELOAD` is loaded by the job, as its user, and never by a root process.
//!
//! Creating users needs root: without it these tests say so and return, unless
//! `GPUMESH_REQUIRE_ROOT=1` (CI), where they fail.

use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpu_agent::config::{Confine, RunAs, UidRange};
use gpu_agent::executor::cgroups::CgroupLayout;
use gpu_agent::executor::confine::Confinement;
use gpu_agent::executor::job_dir::JobDir;
use gpu_agent::executor::limits::Limits;
use gpu_agent::executor::{ExecutorSettings, prepare_run, supervisor_command};
use gpu_raft_store::{Account, JobSpec, Outcome};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("GPUMESH_REQUIRE_ROOT").is_none_or(|v| v != "1"),
        "GPUMESH_REQUIRE_ROOT=1 but this test is not root"
    );
    eprintln!("SKIPPED: creating users and running jobs as them needs root");
    false
}

/// Run a user-database tool, retrying while another process holds the database's lock
/// (tests, and other test binaries, create users at the same time).
fn admin(tool: &str, args: &[&str]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new(tool)
            .args(args)
            .output()
            .map_err(|e| format!("{tool}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if !err.contains("lock") || Instant::now() > deadline {
            return Err(format!("{tool} {args:?}: {}: {err}", out.status));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A name no other test (or test run) uses.
fn unique(tag: &str) -> String {
    format!("gm{}{tag}", std::process::id())
}

/// A group created for the test, deleted when dropped.
struct TestGroup {
    name: String,
    gid: u32,
}

impl TestGroup {
    fn new(tag: &str) -> Self {
        let name = unique(tag);
        admin("groupadd", &[&name]).expect("groupadd");
        let gid = nix::unistd::Group::from_name(&name)
            .expect("group database")
            .expect("the new group")
            .gid
            .as_raw();
        Self { name, gid }
    }
}

impl Drop for TestGroup {
    fn drop(&mut self) {
        if let Err(e) = admin("groupdel", &[&self.name]) {
            eprintln!("cleanup: {e}");
        }
    }
}

/// A user created with `useradd -m` (home, own group, `/bin/sh`), removed with its home when
/// dropped.
struct TestUser {
    name: String,
    uid: u32,
    gid: u32,
    home: PathBuf,
}

impl TestUser {
    fn new(tag: &str, groups: &[&TestGroup]) -> Self {
        let name = unique(tag);
        let mut args = vec!["-m", "-s", "/bin/sh"];
        let list = groups
            .iter()
            .map(|g| g.name.as_str())
            .collect::<Vec<_>>()
            .join(",");
        if !groups.is_empty() {
            args.extend(["-G", &list]);
        }
        args.push(&name);
        admin("useradd", &args).expect("useradd");
        let u = nix::unistd::User::from_name(&name)
            .expect("user database")
            .expect("the new user");
        Self {
            name,
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
            home: u.dir,
        }
    }

    fn account(&self) -> Account {
        Account::user(&self.name)
    }

    /// A file the user's job wrote into its home.
    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.home.join(name))
            .unwrap_or_else(|e| panic!("{}/{name}: {e}", self.home.display()))
            .trim()
            .to_owned()
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        if let Err(e) = admin("userdel", &["-r", &self.name]) {
            eprintln!("cleanup: {e}");
        }
    }
}

/// A jobs directory laid out as an agent's (reachable by other users; the temporary directory
/// itself is 0700), on node 1.
struct Node {
    tmp: tempfile::TempDir,
    settings: ExecutorSettings,
}

impl Node {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod tempdir");
        let jobs_dir = tmp.path().join("jobs");
        std::fs::create_dir(&jobs_dir).expect("jobs dir");
        std::fs::set_permissions(&jobs_dir, std::fs::Permissions::from_mode(0o711))
            .expect("chmod jobs dir");
        let lease_path = tmp.path().join("lease");
        // The lease timeout below outlasts every test, so the file never needs renewing.
        std::fs::write(&lease_path, "0").expect("lease");
        let nobody = nix::unistd::User::from_name("nobody")
            .expect("user database")
            .expect("this host has a user nobody");
        let settings = ExecutorSettings {
            jobs_dir,
            lease_path,
            lease: Duration::from_secs(600),
            stop_grace: Duration::from_secs(2),
            agent_exe: env!("CARGO_BIN_EXE_gpu-agent").into(),
            tick: Duration::from_secs(1),
            run_as: RunAs {
                name: "nobody".into(),
                uid: nobody.uid.as_raw(),
                gid: nobody.gid.as_raw(),
            },
            run_as_by_tenant: Default::default(),
            cgroup_root: "/nonexistent/cgroup".into(),
            uid_range: UidRange::default(),
            confine: Confine::default(),
            disk: Default::default(),
            containers: Default::default(),
        };
        Self { tmp, settings }
    }

    /// Start run (job, 1) of `spec` as the executor does; `Err`: the failed-to-start reason
    /// the executor would record.
    fn start(&self, job: u64, spec: &JobSpec) -> Result<(JobDir, Supervisor), String> {
        let dir = JobDir::new(&self.settings.jobs_dir, job, 1);
        // Without job cgroups: limits and the device fence are `confinement.rs`'s.
        let plan = Confinement {
            cgroups: CgroupLayout::None {
                reason: "not these tests'".into(),
            },
            limits: Limits::for_job(spec, &self.settings.confine),
            devices: Vec::new(),
        };
        let args: Vec<OsString> = prepare_run(&self.settings, spec, &dir, 1, &plan, &[], None)?;
        let child = supervisor_command(&self.settings.agent_exe, &args)
            .spawn()
            .expect("spawn the supervisor");
        Ok((dir, Supervisor(child)))
    }

    /// Run `spec` to its end.
    fn run(&self, job: u64, spec: &JobSpec) -> (JobDir, Outcome) {
        let (dir, shim) = self
            .start(job, spec)
            .unwrap_or_else(|e| panic!("job {job} did not start: {e}"));
        let outcome = shim.wait(&dir);
        (dir, outcome)
    }
}

struct Supervisor(std::process::Child);

impl Supervisor {
    fn pid(&self) -> i32 {
        i32::try_from(self.0.id()).expect("pid")
    }

    fn wait(mut self, dir: &JobDir) -> Outcome {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                assert!(status.success(), "the supervisor failed: {status}");
                return dir.exit().expect("exit.json is written");
            }
            assert!(Instant::now() < deadline, "the supervisor did not finish");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Supervisor {
    /// Stop the job the supervisor's way (SIGTERM: it stops the job's process group), so no
    /// job process outlives the test and its user can be removed.
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            kill(Pid::from_raw(self.pid()), Signal::SIGTERM).ok();
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            self.0.kill().ok();
            self.0.wait().ok();
        }
    }
}

fn shell(script: &str, account: Account, env: &[(&str, String)]) -> JobSpec {
    let mut spec: JobSpec = serde_json::from_value(serde_json::json!({
        "name": "identity",
        "command": ["sh", "-c", script],
    }))
    .expect("spec");
    spec.account = Some(account);
    spec.env = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    spec
}

fn wait_for(path: &Path, dir: &JobDir) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear; stderr.log: {:?}",
            path.display(),
            std::fs::read_to_string(dir.stderr())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `Uid:` / `Gid:` of /proc/PID/status: real, effective, saved, filesystem.
fn ids_of(pid: i32, field: &str) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .expect(field)
        .split_whitespace()
        .map(|id| id.parse().expect("id"))
        .collect()
}

/// A process's environment, sorted.
fn environ(pid: i32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
    let mut vars: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    vars.sort();
    vars
}

#[test]
fn two_accounts_run_as_their_users_and_cannot_touch_each_other() {
    if !is_root() {
        return;
    }
    let (a, b) = (TestUser::new("a", &[]), TestUser::new("b", &[]));
    let node = Node::new();

    // B: records who and where it is, then sleeps holding a secret in its environment.
    let secret = format!("b-secret-{}", std::process::id());
    let b_spec = shell(
        "id -u > \"$HOME/id\"; pwd > \"$HOME/pwd\"; echo $$ > \"$HOME/pid.tmp\"; \
         mv \"$HOME/pid.tmp\" \"$HOME/pid\"; exec sleep 60",
        b.account(),
        &[("SECRET", secret.clone())],
    );
    let (b_dir, b_shim) = node.start(1, &b_spec).expect("B starts");
    wait_for(&b.home.join("pid"), &b_dir);
    let b_pid: i32 = b.read("pid").parse().expect("B's pid");
    assert_eq!(
        ids_of(b_pid, "Uid"),
        [b.uid; 4],
        "B's job is B in every uid"
    );
    assert_eq!(ids_of(b_pid, "Gid"), [b.gid; 4]);
    assert!(
        environ(b_pid).contains(&format!("SECRET={secret}")),
        "B's job has its environment"
    );
    // Its supervisor is root, with nothing but PATH, LANG and its allocator's setting.
    assert_eq!(ids_of(b_shim.pid(), "Uid"), [0; 4]);
    let shim_env = environ(b_shim.pid());
    assert_eq!(
        shim_env
            .iter()
            .map(|v| v.split('=').next().unwrap_or_default())
            .collect::<Vec<_>>(),
        ["LANG", "PATH", "_RJEM_MALLOC_CONF"],
        "{shim_env:?}"
    );
    // The job's environment file: the supervisor's alone, in a run directory jobs only pass.
    let env_file = std::fs::metadata(b_dir.path.join("env.json")).expect("env.json");
    assert_eq!((env_file.uid(), env_file.mode() & 0o777), (0, 0o600));
    let run_dir = std::fs::metadata(&b_dir.path).expect("run dir");
    assert_eq!((run_dir.uid(), run_dir.mode() & 0o777), (0, 0o711));

    // A: tries to read B's environment, to signal B, and to read B's environment file.
    let a_spec = shell(
        "id -u > \"$HOME/id\"; pwd > \"$HOME/pwd\"; env > \"$HOME/env\"; \
         grep -E '^(Uid|Gid):' /proc/self/status > \"$HOME/status\"; \
         if cat /proc/$TARGET/environ > \"$HOME/environ\" 2> \"$HOME/environ.err\"; \
           then echo read; else echo denied; fi > \"$HOME/environ.result\"; \
         if kill -0 $TARGET 2> \"$HOME/kill.err\"; then echo sent; else echo refused; fi \
           > \"$HOME/kill.result\"; \
         if cat \"$B_RUN/env.json\" > \"$HOME/envfile\" 2>&1; then echo read; else echo denied; fi \
           > \"$HOME/envfile.result\"",
        a.account(),
        &[
            ("TARGET", b_pid.to_string()),
            ("B_RUN", b_dir.path.display().to_string()),
        ],
    );
    let (_, outcome) = node.run(2, &a_spec);
    assert_eq!(outcome, Outcome::Exited { code: 0 });

    // Each ran as its user, in its home, and wrote there.
    assert_eq!(a.read("id"), a.uid.to_string());
    assert_eq!(b.read("id"), b.uid.to_string());
    assert_eq!(a.read("pwd"), a.home.display().to_string());
    assert_eq!(b.read("pwd"), b.home.display().to_string());
    let written = std::fs::metadata(a.home.join("id")).expect("A's file");
    assert_eq!((written.uid(), written.gid()), (a.uid, a.gid));
    let status = a.read("status");
    assert_eq!(
        status,
        format!(
            "Uid:\t{0}\t{0}\t{0}\t{0}\nGid:\t{1}\t{1}\t{1}\t{1}",
            a.uid, a.gid
        ),
        "A's job is A in every uid, not root"
    );
    let env = a.read("env");
    for var in [
        format!("USER={}", a.name),
        format!("LOGNAME={}", a.name),
        format!("HOME={}", a.home.display()),
        "SHELL=/bin/sh".to_owned(),
    ] {
        assert!(
            env.lines().any(|l| l == var),
            "{var} not in A's env:\n{env}"
        );
    }
    assert!(!env.contains(&secret), "B's secret reached A: {env}");

    // A could neither read B's environment, nor signal B, nor read B's environment file.
    assert_eq!(a.read("environ.result"), "denied");
    assert!(a.read("environ.err").contains("Permission denied"));
    assert!(!a.read("environ").contains(&secret));
    assert_eq!(a.read("kill.result"), "refused");
    let kill_err = a.read("kill.err");
    assert!(
        kill_err.contains("Operation not permitted"),
        "kill -0 must fail with EPERM (B is alive): {kill_err}"
    );
    assert_eq!(a.read("envfile.result"), "denied", "{}", a.read("envfile"));
    assert!(!a.read("envfile").contains(&secret));
    assert!(
        nix::unistd::getpgid(Some(Pid::from_raw(b_pid))).is_ok(),
        "B still runs"
    );
    drop(b_shim);
}

#[test]
fn supplementary_groups_are_the_users_and_the_accounts() {
    if !is_root() {
        return;
    }
    let (member, extra) = (TestGroup::new("gm"), TestGroup::new("gx"));
    let user = TestUser::new("g", &[&member]);
    let node = Node::new();
    let mut account = user.account();
    account.groups = vec![extra.name.clone()];
    let spec = shell(
        "id -g > \"$HOME/gid\"; id -G > \"$HOME/groups\"",
        account,
        &[],
    );
    assert_eq!(node.run(1, &spec).1, Outcome::Exited { code: 0 });
    let mut groups: Vec<u32> = user
        .read("groups")
        .split_whitespace()
        .map(|g| g.parse().expect("gid"))
        .collect();
    groups.sort_unstable();
    let mut want = vec![user.gid, member.gid, extra.gid];
    want.sort_unstable();
    assert_eq!(
        groups, want,
        "own group, NSS group, the account's group; no root"
    );
    assert_eq!(user.read("gid"), user.gid.to_string());

    // By ids: exactly the ids given (primary group `extra`, no NSS groups).
    let by_id = Account {
        user: user.uid.to_string(),
        group: Some(extra.gid.to_string()),
        groups: Vec::new(),
    };
    let spec = shell(
        "id -u > \"$HOME/n-uid\"; id -g > \"$HOME/n-gid\"; id -G > \"$HOME/n-groups\"",
        by_id,
        &[],
    );
    assert_eq!(node.run(2, &spec).1, Outcome::Exited { code: 0 });
    assert_eq!(user.read("n-uid"), user.uid.to_string());
    assert_eq!(user.read("n-gid"), extra.gid.to_string());
    assert_eq!(user.read("n-groups"), extra.gid.to_string());
}

#[test]
fn an_account_this_node_cannot_be_fails_the_start_with_the_reason() {
    if !is_root() {
        return;
    }
    let user = TestUser::new("r", &[]);
    let mut node = Node::new();
    let marker = node.tmp.path().join("ran");
    let script = format!("touch {}", marker.display());
    let fails = |node: &Node, job: u64, account: Account| -> String {
        let spec = shell(&script, account, &[]);
        let err = match node.start(job, &spec) {
            Ok(_) => panic!("job {job} started"),
            Err(e) => e,
        };
        let dir = JobDir::new(&node.settings.jobs_dir, job, 1);
        assert!(
            !dir.path.join("env.json").exists(),
            "nothing is prepared for a run that cannot start"
        );
        err
    };

    let missing = unique("nosuch");
    let err = fails(&node, 1, Account::user(&missing));
    assert_eq!(err, format!("account {missing} does not exist on node n1"));

    let mut bad_group = user.account();
    bad_group.groups = vec![unique("nogroup")];
    let err = fails(&node, 2, bad_group);
    assert!(
        err.contains(&format!("group {} of account", unique("nogroup"))),
        "{err}"
    );
    assert!(err.ends_with("does not exist on node n1"), "{err}");

    node.settings.uid_range = UidRange {
        first: user.uid + 1,
        last: user.uid + 100,
    };
    let err = fails(&node, 3, user.account());
    assert_eq!(
        err,
        format!(
            "account {} is uid {} on node n1, outside its jobs.uid_range {}-{}",
            user.name,
            user.uid,
            user.uid + 1,
            user.uid + 100
        )
    );
    node.settings.uid_range = UidRange::default();
    let mut relative = shell(&script, user.account(), &[]);
    relative.workdir = Some("data".into());
    let err = node.start(4, &relative).err().expect("a relative workdir");
    assert_eq!(err, "workdir \"data\" is not an absolute path");
    assert!(!marker.exists(), "no job ran");
}

#[test]
fn the_job_enters_its_workdir_as_its_user_not_as_root() {
    if !is_root() {
        return;
    }
    let user = TestUser::new("w", &[]);
    let node = Node::new();
    // Root may enter it; the job's user may not.
    let closed = node.tmp.path().join("closed");
    std::fs::create_dir(&closed).expect("mkdir");
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let mut spec = shell("touch ran", user.account(), &[]);
    spec.workdir = Some(closed.display().to_string());
    match node.run(1, &spec).1 {
        Outcome::FailedToStart { message } => {
            let place = format!("(as uid {}, in {})", user.uid, closed.display());
            assert!(
                message.contains("Permission denied") && message.ends_with(&place),
                "{message}"
            );
        }
        other => panic!("expected a failed start, got {other:?}"),
    }
    assert!(!closed.join("ran").exists());
}

#[test]
fn a_jobs_ld_preload_is_loaded_by_the_job_as_its_user_never_by_root() {
    if !is_root() {
        return;
    }
    if Command::new("cc").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("GPUMESH_REQUIRE_ROOT").is_none_or(|v| v != "1"),
            "this test needs a C compiler (cc)"
        );
        eprintln!("SKIPPED: no C compiler (cc) to build the LD_PRELOAD probe");
        return;
    }
    let user = TestUser::new("p", &[]);
    let node = Node::new();
    // A world-writable directory, where an earlier job could have put the library.
    let drop_box = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(drop_box.path(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    let source = drop_box.path().join("probe.c");
    std::fs::write(
        &source,
        r#"#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void probe(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/loaded-euid-%d-pid-%d", MARKER_DIR, (int)geteuid(), (int)getpid());
    int fd = open(path, O_CREAT | O_WRONLY, 0666);
    if (fd >= 0) close(fd);
}
"#,
    )
    .expect("probe source");
    let library = drop_box.path().join("probe.so");
    let built = Command::new("cc")
        .arg(format!("-DMARKER_DIR=\"{}\"", drop_box.path().display()))
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .output()
        .expect("cc");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    std::fs::set_permissions(&library, std::fs::Permissions::from_mode(0o777)).expect("chmod");

    let spec = shell(
        "id -u > \"$HOME/id\"",
        user.account(),
        &[("LD_PRELOAD", library.display().to_string())],
    );
    assert_eq!(node.run(1, &spec).1, Outcome::Exited { code: 0 });
    assert_eq!(user.read("id"), user.uid.to_string());

    let markers: Vec<String> = std::fs::read_dir(drop_box.path())
        .expect("markers")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("loaded-euid-"))
        .collect();
    let by = |euid: u32| {
        markers
            .iter()
            .filter(|m| m.starts_with(&format!("loaded-euid-{euid}-")))
            .count()
    };
    assert!(
        by(user.uid) > 0,
        "the job loaded the library as its user (the probe works): {markers:?}"
    );
    assert_eq!(
        by(0),
        0,
        "a root process loaded the job's library: {markers:?}"
    );
}
