//! docs/operations.md, run as written ([ops]). The blocks of its procedures (fenced `sh` blocks
//! whose first line says where they run: `# on gpu1`, `# on workstation`) are read from the
//! guide itself, so the guide and this test cannot drift apart, and run in order on three
//! emulated hosts:
//! - each host a network namespace (the guide's 10.0.0.N is 10.a.b.N here), with its own
//!   `/etc/gpumesh` and `/var/lib/gpumesh` (directories under the test's root, the paths in
//!   the blocks rewritten to them);
//! - simulated GPUs where the guide says `gpu_backend = "nvml"`;
//! - the agent started by hand where a block says `systemctl` (`gpu-agent run --config
//!   /etc/gpumesh/agent.toml`, and `start` returns once it logs "agent ready", as the unit's
//!   `Type=notify` does), `scp` a copy between the hosts' directories, `dpkg -i` nothing (the
//!   build under test is the one installed).
//!
//! Bootstrap and join, drain-and-stop with a job running on the drained host, a rolling
//! restart of the leader's host with leadership moved first, a backup, a restore of the whole
//! cluster from it (every host into the new cluster), the admin certificate renewed. Then: every job
//! succeeded (none failed, none lost), leadership left the restarted host, the backup is
//! there, and no agent logged an ERROR line.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpu_chaos::netns::Netns;

/// What a block may call that a test host does not have, and the hosts' directories.
const PREAMBLE: &str = r#"
systemctl() {
  case "$1" in
    start) agent_start ;;
    stop) agent_stop ;;
    restart) agent_stop && agent_start ;;
    *) echo "systemctl $*: not emulated" >&2; return 1 ;;
  esac
}
agent_start() {
  local log="$HOST_ROOT/agent.log" from
  from=$(stat -c %s "$log" 2>/dev/null || echo 0)
  setsid gpu-agent run --config "$HOST_ROOT/etc/gpumesh/agent.toml" >>"$log" 2>&1 </dev/null &
  echo $! >"$HOST_ROOT/agent.pid"
  for _ in $(seq 900); do
    tail -c +$((from + 1)) "$log" | grep -q "agent ready" && return 0
    alive "$(cat "$HOST_ROOT/agent.pid")" || { echo "gpu-agent exited:" >&2; tail -20 "$log" >&2; return 1; }
    sleep 0.1
  done
  echo "gpu-agent not ready after 90 s" >&2; return 1
}
agent_stop() {
  local pid; pid=$(cat "$HOST_ROOT/agent.pid")
  kill -TERM "$pid"
  for _ in $(seq 300); do alive "$pid" || return 0; sleep 0.1; done
  echo "gpu-agent did not stop in 30 s" >&2; return 1
}
alive() {
  [ -r "/proc/$1/stat" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat")" != Z ]
}
dpkg() { echo "dpkg $*: the build under test is installed"; }
scp() {
  local args=() a
  for a in "$@"; do
    if [[ $a =~ ^(gpu[0-9]+):(.*)$ ]]; then
      args+=($GUIDE_ROOT/${BASH_REMATCH[1]}${BASH_REMATCH[2]})
    else
      args+=("$a")
    fi
  done
  cp "${args[@]}"
}
"#;

/// One block of the guide: where it runs, and its commands.
#[derive(Debug)]
struct Block {
    host: String,
    script: String,
}

/// The runnable blocks of section `title` (a `## ` heading), in order.
fn blocks(doc: &str, title: &str) -> Vec<Block> {
    let mut in_section = false;
    let mut fence: Option<(usize, Vec<String>)> = None;
    let mut found = Vec::new();
    for line in doc.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            in_section = heading.trim() == title;
            continue;
        }
        if !in_section {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        match &mut fence {
            None if line.trim() == "```sh" => fence = Some((indent, Vec::new())),
            None => {}
            Some((_, lines)) if line.trim() == "```" => {
                let mut lines = std::mem::take(lines).into_iter();
                let host = lines
                    .next()
                    .and_then(|first| first.strip_prefix("# on ").map(str::to_owned));
                if let Some(host) = host {
                    found.push(Block {
                        host,
                        script: lines.collect::<Vec<_>>().join("\n"),
                    });
                }
                fence = None;
            }
            Some((at, lines)) => {
                let cut = indent.min(*at);
                lines.push(line[cut..].to_owned());
            }
        }
    }
    found
}

/// Three hosts and a workstation.
struct Hosts {
    net: Netns,
    root: PathBuf,
    bin_dir: PathBuf,
}

impl Hosts {
    fn new(net: Netns, root: PathBuf) -> Hosts {
        for id in 1..=3 {
            let host = root.join(format!("gpu{id}"));
            for dir in ["etc/gpumesh", "var/lib"] {
                std::fs::create_dir_all(host.join(dir)).expect("a host directory");
            }
        }
        std::fs::create_dir_all(root.join("workstation")).expect("the workstation's home");
        let bin_dir = gpu_tests::bin("gpu-agent")
            .parent()
            .expect("the binaries' directory")
            .to_owned();
        Hosts { net, root, bin_dir }
    }

    fn host_root(&self, host: &str) -> PathBuf {
        self.root.join(host)
    }

    /// The guide's addresses and paths made this host's.
    fn rewrite(&self, host: &str, script: &str) -> String {
        let ip = self.net.ip(1).to_string();
        let prefix = &ip[..ip.len() - 1];
        let mut script = script
            .replace("10.0.0.", prefix)
            .replace("gpu_backend = \"nvml\"", "gpu_backend = \"sim\"");
        if host != "workstation" {
            let mine = self.host_root(host);
            for path in ["/etc/gpumesh", "/var/lib/gpumesh"] {
                script = script.replace(path, &format!("{}{path}", mine.display()));
            }
        }
        script
    }

    /// Run `block` where it says; its output, or why it failed.
    fn run(&self, block: &Block) -> Result<String, String> {
        let script = format!("{PREAMBLE}\n{}", self.rewrite(&block.host, &block.script));
        let mut cmd = match block.host.strip_prefix("gpu") {
            Some(n) => {
                let id: u64 = n
                    .parse()
                    .map_err(|_| format!("unknown host {}", block.host))?;
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &self.net.ns(id), "bash"]);
                c
            }
            None if block.host == "workstation" => Command::new("bash"),
            None => return Err(format!("unknown host {}", block.host)),
        };
        let home = self.host_root("workstation");
        let out = cmd
            .args(["-euo", "pipefail", "-c", &script])
            .env_clear()
            .env(
                "PATH",
                format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", self.bin_dir.display()),
            )
            .env("HOME", &home)
            .env("GUIDE_ROOT", &self.root)
            .env("HOST_ROOT", self.host_root(&block.host))
            .current_dir(&home)
            .output()
            .map_err(|e| format!("running bash: {e}"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        match out.status.success() {
            true => Ok(text),
            false => Err(format!(
                "on {} ({}):\n{}\n--- output ---\n{text}",
                block.host, out.status, block.script
            )),
        }
    }

    /// Run every block of section `title`; there must be some.
    fn follow(&self, doc: &str, title: &str) {
        let steps = blocks(doc, title);
        assert!(
            !steps.is_empty(),
            "the guide has no runnable block under ## {title}"
        );
        for step in &steps {
            match self.run(step) {
                Ok(out) => println!("## {title}, on {}:\n{out}", step.host),
                Err(why) => panic!("## {title}: {why}\n{}", self.logs()),
            }
        }
    }

    /// gpuctl on the workstation, with its config from the guide; JSON out.
    fn gpuctl(&self, args: &[&str]) -> serde_json::Value {
        let out = Command::new(self.bin_dir.join("gpuctl"))
            .args(["-o", "json"])
            .args(args)
            .env("HOME", self.host_root("workstation"))
            .env_remove("GPUCTL_CONFIG")
            .output()
            .expect("run gpuctl");
        assert!(
            out.status.success(),
            "gpuctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    }

    fn log(&self, id: u64) -> String {
        std::fs::read_to_string(self.host_root(&format!("gpu{id}")).join("agent.log"))
            .unwrap_or_default()
    }

    fn logs(&self) -> String {
        (1..=3)
            .map(|id| {
                let log = self.log(id);
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- gpu{id} ---\n{}\n", tail.join("\n"))
            })
            .collect()
    }
}

impl Drop for Hosts {
    /// The agents were started in sessions of their own: stop them.
    fn drop(&mut self) {
        for id in 1..=3 {
            let pid = self.host_root(&format!("gpu{id}")).join("agent.pid");
            if let Some(pid) = std::fs::read_to_string(pid)
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok())
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// The level of a log line (the word after its timestamp), without colour codes.
fn level(line: &str) -> Option<String> {
    let mut plain = String::new();
    let mut chars = line.chars();
    while let Some(ch) = chars.next() {
        if ch == '\u{1b}' {
            chars.by_ref().find(char::is_ascii_alphabetic);
        } else {
            plain.push(ch);
        }
    }
    plain.split_whitespace().nth(1).map(str::to_owned)
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn the_operations_guide_works_as_written() {
    if let Some(why) = Netns::unavailable() {
        assert!(
            std::env::var_os("GPUMESH_REQUIRE_ROOT").is_none(),
            "GPUMESH_REQUIRE_ROOT is set, but network namespaces are unavailable: {why}"
        );
        println!("skipping the operations guide: {why}");
        return;
    }
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .expect("docs/operations.md");
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("operations-guide-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let hosts = Hosts::new(Netns::create(3).expect("three namespaces"), root);

    hosts.follow(&doc, "Bootstrap a multi-host cluster");
    let members = hosts.gpuctl(&["cluster", "members"]);
    assert_eq!(members.as_array().map(Vec::len), Some(3), "{members}");

    // The test's own workload: a job on gpu3 that the drain must move, and others.
    hosts.gpuctl(&["node", "label", "3", "guide=drained"]);
    let submit = |args: &[&str]| {
        let mut all = vec!["job", "submit", "--gpus", "1"];
        all.extend_from_slice(args);
        hosts.gpuctl(&all)["job_id"].as_u64().expect("a job id")
    };
    let pinned = submit(&[
        "--name",
        "on-gpu3",
        "--selector",
        "guide=drained",
        "--",
        "sleep",
        "8",
    ]);
    let mut jobs = vec![pinned];
    for i in 0..3 {
        jobs.push(submit(&[
            "--name",
            &format!("batch-{i}"),
            "--",
            "sleep",
            "2",
        ]));
    }
    let pinned_id = pinned.to_string();
    wait_until("the job on gpu3 to run", Duration::from_secs(60), || {
        hosts.gpuctl(&["job", "get", &pinned_id])["state"] == "running"
    });
    hosts.follow(&doc, "Drain for maintenance");
    jobs.push(submit(&["--name", "after-drain", "--", "true"]));

    let leader_before = hosts.gpuctl(&["cluster", "status"])["leader_id"].as_u64();
    hosts.follow(&doc, "Upgrade");
    let leader_after = hosts.gpuctl(&["cluster", "status"])["leader_id"].as_u64();
    if leader_before == Some(1) {
        assert_ne!(leader_after, Some(1), "leadership was moved off gpu1 first");
    }
    jobs.push(submit(&["--name", "after-upgrade", "--", "true"]));

    // Nothing lost, nothing failed.
    let all_succeeded = || {
        for id in &jobs {
            let id = id.to_string();
            wait_until(
                &format!("job {id} to end"),
                Duration::from_secs(120),
                || {
                    let state = hosts.gpuctl(&["job", "get", &id])["state"].clone();
                    state != "pending" && state != "running"
                },
            );
            let job = hosts.gpuctl(&["job", "get", &id]);
            assert_eq!(job["state"], "succeeded", "{job}");
        }
    };
    all_succeeded();
    let moved = hosts.gpuctl(&["job", "get", &pinned_id]);
    assert_eq!(
        moved["attempts"], 1,
        "one attempt: the evicted run spent none: {moved}"
    );

    hosts.follow(&doc, "Back up");
    let backups = std::fs::read_dir(hosts.host_root("workstation").join("gpumesh-backups"))
        .expect("the backup folder")
        .count();
    assert_eq!(backups, 1);
    hosts.follow(&doc, "Restore");
    let members = hosts.gpuctl(&["cluster", "members"]);
    assert_eq!(members.as_array().map(Vec::len), Some(3), "{members}");
    all_succeeded();
    hosts.follow(&doc, "Renew the admin certificate");

    let errors: Vec<String> = (1..=3)
        .flat_map(|id| {
            hosts
                .log(id)
                .lines()
                .filter(|l| level(l).as_deref() == Some("ERROR"))
                .map(|l| format!("gpu{id}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(errors.is_empty(), "ERROR lines:\n{}", errors.join("\n"));
}
