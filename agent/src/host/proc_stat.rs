//! A process's line in `/proc/<pid>/stat`: the one parser of it, for the executor (is this
//! still our supervisor? which process group is it in?) and the footprint bench (CPU time).

use std::fs;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// `R`, `S`, `D`, `Z` (zombie), `X` (dead), …
    pub state: char,
    pub pgrp: u32,
    /// utime + stime, clock ticks.
    pub cpu_ticks: u64,
    /// When the process started, in clock ticks after boot. With the pid it names one process
    /// for the life of the host: a pid alone is handed to a new process once its owner is gone
    /// (within minutes on a busy host with the default `pid_max` of 32768).
    pub start_ticks: u64,
}

impl ProcStat {
    pub fn of(pid: u32) -> Option<Self> {
        Self::parse(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    pub fn of_self() -> Option<Self> {
        Self::parse(&fs::read_to_string("/proc/self/stat").ok()?)
    }

    /// The command name (field 2) may hold spaces and parentheses, so fields are counted after
    /// its last `)`.
    pub fn parse(stat: &str) -> Option<Self> {
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state is field 3, pgrp 5, utime 14, stime 15, starttime 22.
        let field = |n: usize| fields.get(n - 3).copied();
        let number = |n: usize| field(n)?.parse::<u64>().ok();
        Some(Self {
            state: field(3)?.chars().next()?,
            pgrp: field(5)?.parse().ok()?,
            cpu_ticks: number(14)? + number(15)?,
            start_ticks: number(22)?,
        })
    }

    /// Still running: neither a zombie waiting to be reaped nor dead.
    pub fn is_running(&self) -> bool {
        !matches!(self.state, 'Z' | 'X')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_counted_after_the_last_parenthesis() {
        let stat = "4242 (gpu agent (x)) S 1 4200 4242 0 -1 4194560 1234 0 0 0 150 37 0 0 20 0 \
                    12 0 99 123456 789 18446744073709551615";
        assert_eq!(
            ProcStat::parse(stat),
            Some(ProcStat {
                state: 'S',
                pgrp: 4200,
                cpu_ticks: 187,
                start_ticks: 99,
            })
        );
        assert_eq!(ProcStat::parse("43 (a) b (c)) R 42 40 40 0"), None);
        assert_eq!(ProcStat::parse("garbage"), None);
    }

    #[test]
    fn our_own_process_reads_as_running() {
        let me = ProcStat::of_self().expect("our own stat");
        assert!(me.is_running());
        let by_pid = ProcStat::of(std::process::id()).expect("our stat by pid");
        assert_eq!((by_pid.pgrp, by_pid.start_ticks), (me.pgrp, me.start_ticks));
    }
}
