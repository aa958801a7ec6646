//! The name of a run's cgroup, `job-<id>-g<generation>-s<supervisor pid>`: written by the
//! run's supervisor (`executor::cgroups`), read back by the monitor to tell which job a process
//! belongs to (`monitor::attribution`) and by the agent's start-up sweep of the cgroups that
//! killed supervisors left (`executor::cgroup_tree`). Several agents may share a host and its
//! hierarchies (`gpu-agent dev`, a gang's members, tests); the supervisor's pid keeps their
//! runs apart while it lives.

/// The name of a run's cgroup.
pub fn cgroup_name(job: u64, generation: u64, supervisor: u32) -> String {
    format!("job-{job}-g{generation}-s{supervisor}")
}

/// A run's cgroup name read back (`parse_cgroup_name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunCgroupName {
    pub job: u64,
    pub generation: u64,
    /// The supervisor's pid: none in the names that builds before it wrote.
    pub supervisor: Option<u32>,
}

/// `job-<id>-g<generation>[-s<supervisor pid>]`, as `cgroup_name` writes it; `None` for any
/// other name.
pub fn parse_cgroup_name(name: &str) -> Option<RunCgroupName> {
    let (job, rest) = name.strip_prefix("job-")?.split_once("-g")?;
    let (generation, supervisor) = match rest.split_once("-s") {
        Some((generation, pid)) => (generation, pid.parse().ok()),
        None => (rest, None),
    };
    Some(RunCgroupName {
        job: job.parse().ok()?,
        generation: generation.parse().ok()?,
        supervisor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_runs_of_several_agents_apart() {
        assert_eq!(cgroup_name(42, 3, 1234), "job-42-g3-s1234");
        assert_ne!(cgroup_name(1, 1, 100), cgroup_name(1, 1, 101));
    }

    #[test]
    fn names_read_back() {
        let run = |job, generation, supervisor| RunCgroupName {
            job,
            generation,
            supervisor,
        };
        assert_eq!(
            parse_cgroup_name(&cgroup_name(7, 12, 4242)),
            Some(run(7, 12, Some(4242)))
        );
        assert_eq!(parse_cgroup_name("job-7-g1"), Some(run(7, 1, None)));
        for other in ["job-x-g1-s2", "job-7-gx-s2", "jobs-7-g1", "job-7"] {
            assert_eq!(parse_cgroup_name(other), None, "{other}");
        }
    }
}
