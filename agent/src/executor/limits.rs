//! A run's resource limits and the pure judgements around them: what a job gets (its request,
//! or this node's defaults for a CPU-only job), whether a run that ended was killed for
//! memory, and the notices for what this node cannot enforce.

use gpu_raft_store::{JobSpec, Outcome};

use crate::config::Confine;

/// A run's resource limits; `None`: unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Thousandths of a core.
    pub cpu_millis: Option<u32>,
    pub memory_mib: Option<u64>,
    /// Processes and threads.
    pub tasks_max: Option<u64>,
}

impl Limits {
    /// The job's request. A CPU-only job (no GPU, no slice) gets the node's default for what it
    /// left out, so no job runs unbounded by accident; a GPU job is sized by its GPUs, and its
    /// host memory stays unlimited unless it asks. Every job gets the task limit.
    pub fn for_job(spec: &JobSpec, confine: &Confine) -> Self {
        let cpu_only = spec.gpus == 0 && spec.slice.is_none();
        Self {
            cpu_millis: spec
                .cpu_millis
                .or(cpu_only.then_some(confine.default_cpu_millis)),
            memory_mib: spec
                .memory_mib
                .or(cpu_only.then_some(confine.default_memory_mib)),
            tasks_max: Some(confine.default_tasks_max),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Which of a run's limits its cgroups hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Enforced {
    pub cpu: bool,
    pub memory: bool,
    pub tasks: bool,
}

/// What the memory cgroup says about the OOM killer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OomEvidence {
    /// Processes the OOM killer killed in the cgroup (v2 `memory.events`, v1 `oom_kill` in
    /// `memory.oom_control`).
    Kills(u64),
    /// Older v1 kernels count only how often the limit was hit (`memory.failcnt`).
    LimitHits(u64),
}

/// How a run ended, with what its memory cgroup saw. A run that failed after the OOM killer
/// killed one of its processes (the job itself, or a child it then failed for) was killed for
/// memory; one that exited 0 regardless was not. Where only limit hits are counted, a SIGKILL
/// (or a shell's 137 for it) after hitting the limit counts. Stops (cancel, time limit, fence)
/// keep their own outcome.
pub fn judge_oom(
    outcome: Outcome,
    evidence: Option<OomEvidence>,
    limit_mib: Option<u64>,
) -> Outcome {
    const SIGKILL: i32 = 9;
    let failed = matches!(outcome, Outcome::Exited { code } if code != 0)
        || matches!(outcome, Outcome::Signaled { .. });
    let killed = matches!(
        outcome,
        Outcome::Signaled { signal: SIGKILL } | Outcome::Exited { code: 137 }
    );
    let oom = match evidence {
        Some(OomEvidence::Kills(n)) => failed && n > 0,
        Some(OomEvidence::LimitHits(n)) => killed && n > 0,
        None => false,
    };
    if oom {
        Outcome::OutOfMemory { limit_mib }
    } else {
        outcome
    }
}

/// The line written to a job's `stderr.log` when this node cannot enforce some of its limits.
pub fn unenforced_notice(limits: &Limits, enforced: Enforced, why: &str) -> Option<String> {
    let mut asked = Vec::new();
    if let Some(m) = limits.cpu_millis.filter(|_| !enforced.cpu) {
        asked.push(format!("cpu {}.{:03} cores", m / 1000, m % 1000));
    }
    if let Some(m) = limits.memory_mib.filter(|_| !enforced.memory) {
        asked.push(format!("memory {m} MiB"));
    }
    if let Some(n) = limits.tasks_max.filter(|_| !enforced.tasks) {
        asked.push(format!("tasks {n}"));
    }
    (!asked.is_empty()).then(|| {
        format!(
            "gpumesh: {why}: the job's limits ({}) are not enforced\n",
            asked.join(", ")
        )
    })
}

/// The line written to a job's `stderr.log` when this node cannot fence its devices.
pub fn unfenced_notice(why: &str) -> String {
    format!(
        "gpumesh: {why}: the job's devices are not fenced (it can open every GPU's device node; only CUDA_VISIBLE_DEVICES narrows what CUDA uses)\n"
    )
}

/// The limits a container gets on open files and processes: the supervisor's hard limits, the
/// process limit no higher than the host's largest pid (runc cannot raise it past that, and a
/// runtime's defaults may exceed both, and then nothing starts). The job's task limit proper is
/// its pids cgroup.
pub fn container_rlimits() -> Vec<(&'static str, u64)> {
    use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit};
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    [
        ("nofile", Resource::RLIMIT_NOFILE, u64::MAX),
        ("nproc", Resource::RLIMIT_NPROC, pid_max),
    ]
    .into_iter()
    .filter_map(|(name, r, cap)| {
        let (_, hard) = getrlimit(r).ok()?;
        let limit = if hard == RLIM_INFINITY {
            cap
        } else {
            hard.min(cap)
        };
        (limit != u64::MAX).then_some((name, limit))
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> JobSpec {
        let mut base = serde_json::json!({"name": "t", "command": ["true"]});
        if let (Some(b), Some(extra)) = (base.as_object_mut(), json.as_object()) {
            b.extend(extra.clone());
        }
        serde_json::from_value(base).expect("spec")
    }

    #[test]
    fn cpu_only_jobs_get_the_defaults_and_every_job_a_task_limit() {
        let confine = Confine {
            default_cpu_millis: 2000,
            default_memory_mib: 1024,
            default_tasks_max: 500,
            ..Confine::default()
        };
        let limits = |json| Limits::for_job(&spec(json), &confine);
        let full = |cpu, mem, tasks| Limits {
            cpu_millis: cpu,
            memory_mib: mem,
            tasks_max: tasks,
        };
        assert_eq!(
            limits(serde_json::json!({})),
            full(Some(2000), Some(1024), Some(500)),
            "CPU-only without a request"
        );
        assert_eq!(
            limits(serde_json::json!({"memory_mib": 64})),
            full(Some(2000), Some(64), Some(500)),
            "its request wins"
        );
        assert_eq!(
            limits(serde_json::json!({"gpus": 1})),
            full(None, None, Some(500)),
            "a GPU job without a request"
        );
        assert_eq!(
            limits(serde_json::json!({"gpus": 2, "cpu_millis": 8000, "memory_mib": 65536})),
            full(Some(8000), Some(65536), Some(500))
        );
        assert!(!limits(serde_json::json!({})).is_empty());
        assert!(Limits::default().is_empty());
    }

    #[test]
    fn only_a_failed_run_with_an_oom_kill_is_out_of_memory() {
        let oom = Outcome::OutOfMemory {
            limit_mib: Some(64),
        };
        let kills = |n| Some(OomEvidence::Kills(n));
        let hits = |n| Some(OomEvidence::LimitHits(n));
        let judge = |o, e| judge_oom(o, e, Some(64));
        let sigkill = Outcome::Signaled { signal: 9 };
        let exited = |code| Outcome::Exited { code };
        assert_eq!(judge(sigkill.clone(), kills(1)), oom);
        assert_eq!(
            judge(exited(137), kills(1)),
            oom,
            "a shell whose child was killed"
        );
        assert_eq!(judge(exited(1), kills(2)), oom, "a job that failed for it");
        assert_eq!(
            judge(exited(0), kills(1)),
            exited(0),
            "survived a child's OOM kill"
        );
        assert_eq!(
            judge(sigkill.clone(), kills(0)),
            sigkill,
            "killed by someone else"
        );
        assert_eq!(judge(exited(3), None), exited(3), "no memory cgroup");
        assert_eq!(judge(sigkill.clone(), hits(4)), oom);
        assert_eq!(judge(exited(137), hits(4)), oom);
        assert_eq!(
            judge(exited(1), hits(4)),
            exited(1),
            "hits alone prove nothing"
        );
        assert_eq!(judge(sigkill.clone(), hits(0)), sigkill);
        for kept in [
            Outcome::Cancelled,
            Outcome::WallTimeExceeded,
            Outcome::Fenced,
        ] {
            assert_eq!(judge(kept.clone(), kills(1)), kept);
        }
        assert_eq!(
            judge_oom(sigkill, kills(1), None),
            Outcome::OutOfMemory { limit_mib: None }
        );
    }

    #[test]
    fn notices_name_what_is_not_enforced() {
        let limits = Limits {
            cpu_millis: Some(1500),
            memory_mib: Some(4096),
            tasks_max: Some(4096),
        };
        let all = Enforced {
            cpu: true,
            memory: true,
            tasks: true,
        };
        assert_eq!(unenforced_notice(&limits, all, "x"), None);
        assert_eq!(
            unenforced_notice(&Limits::default(), Enforced::default(), "x"),
            None
        );
        let n = unenforced_notice(&limits, Enforced::default(), "this node has no job cgroups")
            .expect("notice");
        assert_eq!(
            n,
            "gpumesh: this node has no job cgroups: the job's limits (cpu 1.500 cores, memory 4096 MiB, tasks 4096) are not enforced\n"
        );
        let n = unenforced_notice(
            &limits,
            Enforced {
                tasks: false,
                ..all
            },
            "no pids hierarchy",
        )
        .expect("notice");
        assert!(n.contains("(tasks 4096) are not enforced"), "{n}");
        let n = unfenced_notice("cgroup v2 without a BPF device program");
        assert!(
            n.starts_with(
                "gpumesh: cgroup v2 without a BPF device program: the job's devices are not fenced"
            ),
            "{n}"
        );
        assert!(n.ends_with('\n') && n.lines().count() == 1);
    }
}
