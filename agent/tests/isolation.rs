//! Job isolation through the real `gpu-agent shim`, started with the arguments the executor
//! builds: the job runs as `nobody` in its own `work/` directory and cannot write the run's
//! records; a missing workdir fails the start. (Limits, cgroups and the device fence:
//! `confinement.rs`.)
//!
//! Changing user needs root: those tests say why and return early when not run as root.

use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpu_agent::config::{Confine, RunAs};
use gpu_agent::executor::cgroups::CgroupLayout;
use gpu_agent::executor::confine::Confinement;
use gpu_agent::executor::job_dir::JobDir;
use gpu_agent::executor::limits::Limits;
use gpu_agent::executor::{ExecutorSettings, isolation, prepare_run, supervisor_command};
use gpu_raft_store::{JobSpec, Outcome};

/// A jobs directory laid out as an agent's, reachable by other users (the temporary
/// directory itself is 0700).
struct Node {
    _tmp: tempfile::TempDir,
    settings: ExecutorSettings,
}

impl Node {
    fn new(run_as: RunAs, cgroup_root: PathBuf) -> Node {
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
        let settings = ExecutorSettings {
            jobs_dir,
            lease_path,
            lease: Duration::from_secs(600),
            stop_grace: Duration::from_secs(2),
            agent_exe: env!("CARGO_BIN_EXE_gpu-agent").into(),
            tick: Duration::from_secs(1),
            run_as,
            run_as_by_tenant: Default::default(),
            cgroup_root,
            uid_range: Default::default(),
            confine: Confine::default(),
            disk: Default::default(),
            containers: Default::default(),
        };
        Node {
            _tmp: tmp,
            settings,
        }
    }

    /// Start the supervisor for run (job, 1) of `spec` as the executor does (on node 1, without
    /// job cgroups: limits and the device fence are `confinement.rs`'s).
    fn start(&self, job: u64, spec: &JobSpec) -> (JobDir, Supervisor) {
        let dir = JobDir::new(&self.settings.jobs_dir, job, 1);
        let plan = Confinement {
            cgroups: CgroupLayout::None {
                reason: "not these tests'".into(),
            },
            limits: Limits::for_job(spec, &self.settings.confine),
            devices: Vec::new(),
        };
        let args: Vec<OsString> =
            prepare_run(&self.settings, spec, &dir, 1, &plan, &[], None).expect("prepare the run");
        let child = supervisor_command(&self.settings.agent_exe, &args)
            .spawn()
            .expect("spawn the supervisor");
        (dir, Supervisor(child))
    }
}

struct Supervisor(std::process::Child);

impl Supervisor {
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
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            self.0.kill().ok();
            self.0.wait().ok();
        }
    }
}

fn nobody() -> RunAs {
    let user = nix::unistd::User::from_name("nobody")
        .expect("reading the user database")
        .expect("this host has a user nobody");
    RunAs {
        name: "nobody".into(),
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
    }
}

fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("GPUMESH_REQUIRE_ROOT").is_none_or(|v| v != "1"),
        "GPUMESH_REQUIRE_ROOT=1 but this test is not root"
    );
    eprintln!("SKIPPED: running jobs as another user needs root, and this test is not root");
    false
}

fn shell(script: &str, limits: serde_json::Value) -> JobSpec {
    let mut spec = serde_json::json!({
        "name": "iso",
        "command": ["sh", "-c", script],
    });
    if let (Some(spec), Some(limits)) = (spec.as_object_mut(), limits.as_object()) {
        spec.extend(limits.clone());
    }
    serde_json::from_value(spec).expect("spec")
}

#[test]
fn the_job_runs_as_the_job_user_in_its_own_directory() {
    if !is_root() {
        return;
    }
    let user = nobody();
    let node = Node::new(user.clone(), "/nonexistent/cgroup".into());
    let spec = shell(
        "id -u > out; id -G > groups; touch \"$HOME/x\"; \
         touch ../planted 2>/dev/null; echo forged > ../exit.json 2>/dev/null; exit 0",
        serde_json::json!({}),
    );
    let (dir, shim) = node.start(1, &spec);
    assert_eq!(shim.wait(&dir), Outcome::Exited { code: 0 });

    let work = isolation::work_dir(&dir.path);
    let read = |name: &str| {
        std::fs::read_to_string(work.join(name)).unwrap_or_else(|e| {
            panic!(
                "{name}: {e}; stderr.log: {:?}",
                std::fs::read_to_string(dir.stderr())
            )
        })
    };
    assert_eq!(read("out").trim(), user.uid.to_string(), "ran as nobody");
    assert_eq!(
        read("groups").trim(),
        user.gid.to_string(),
        "only nobody's primary group, none of the supervisor's"
    );
    let x = std::fs::metadata(work.join("x")).expect("the job wrote to its HOME");
    assert_eq!((x.uid(), x.gid()), (user.uid, user.gid));
    let w = std::fs::metadata(&work).expect("work dir");
    assert_eq!((w.uid(), w.mode() & 0o777), (user.uid, 0o700));
    // The run directory and its records stay the supervisor's.
    assert!(
        !dir.path.join("planted").exists(),
        "the job could write into the run directory"
    );
    assert_eq!(std::fs::metadata(&dir.path).expect("run dir").uid(), 0);
    for log in [dir.stdout(), dir.stderr()] {
        assert_eq!(
            std::fs::metadata(&log).expect("log").uid(),
            0,
            "{}",
            log.display()
        );
    }
}

#[test]
fn a_tenant_with_a_user_of_its_own_runs_as_that_user() {
    if !is_root() {
        return;
    }
    let daemon = nix::unistd::User::from_name("daemon")
        .expect("reading the user database")
        .expect("this host has a user daemon");
    let tenant_user = RunAs {
        name: "daemon".into(),
        uid: daemon.uid.as_raw(),
        gid: daemon.gid.as_raw(),
    };
    let mut node = Node::new(nobody(), "/nonexistent/cgroup".into());
    node.settings
        .run_as_by_tenant
        .insert("vision".into(), tenant_user.clone());
    let ids = |tenant: &str, job: u64| {
        let mut spec = shell("id -u > out", serde_json::json!({}));
        spec.tenant = tenant.into();
        let (dir, shim) = node.start(job, &spec);
        assert_eq!(shim.wait(&dir), Outcome::Exited { code: 0 });
        std::fs::read_to_string(isolation::work_dir(&dir.path).join("out")).expect("out")
    };
    assert_eq!(ids("vision", 1).trim(), tenant_user.uid.to_string());
    assert_eq!(
        ids("nlp", 2).trim(),
        nobody().uid.to_string(),
        "the default user"
    );
}

#[test]
fn a_missing_workdir_fails_the_start_clearly() {
    let me = RunAs {
        name: "me".into(),
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    };
    let node = Node::new(me, "/nonexistent/cgroup".into());
    let mut spec = shell("touch ran", serde_json::json!({}));
    spec.workdir = Some("/no/such/dir".into());
    let (dir, shim) = node.start(3, &spec);
    match shim.wait(&dir) {
        Outcome::FailedToStart { message } => {
            assert!(
                message.contains("/no/such/dir") && message.contains("does not exist"),
                "{message}"
            );
        }
        other => panic!("expected a failed start, got {other:?}"),
    }
    assert!(!isolation::work_dir(&dir.path).join("ran").exists());
}
