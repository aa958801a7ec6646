//! Per-node network namespaces for partition scenarios: `gm<run>-n<id>` namespaces, each with
//! loopback up and one veth (`eth0`, `10.a.b.<id>/24`) on a bridge `gm<run>-br` in the root
//! namespace, which holds `10.a.b.254` so the test process reaches every agent directly.
//! Everything is removed on drop; leftovers of a killed run (its process is gone) are removed
//! before a new network is made.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Every name this module creates starts with this.
const PREFIX: &str = "gm";
/// The port every agent listens on inside its namespace.
pub const AGENT_PORT: u16 = 7000;
/// The root namespace's address on the bridge (last octet).
const HOST: u8 = 254;

static RUNS: AtomicU32 = AtomicU32::new(0);
/// Held while choosing a subnet and building, so two runs in one process never pick the same.
static BUILDING: Mutex<()> = Mutex::new(());

/// One run's namespaces, bridge and addresses.
#[derive(Debug)]
pub struct Netns {
    run: String,
    subnet: [u8; 2],
    nodes: Vec<u64>,
}

impl Netns {
    /// Why namespaces cannot be used here (`None` when they can): the test must be root, `ip`
    /// and `nft` must be installed, and a probe namespace must be creatable and take nft rules
    /// (a container without `CAP_NET_ADMIN` fails here). Probed once per process.
    pub fn unavailable() -> Option<String> {
        static PROBED: OnceLock<Option<String>> = OnceLock::new();
        PROBED.get_or_init(probe).clone()
    }

    /// Namespaces for nodes `1..=n` on a fresh bridge and a /24 no interface here uses yet.
    pub fn create(n: u64) -> anyhow::Result<Netns> {
        anyhow::ensure!((1..HOST as u64).contains(&n), "1 to 253 nodes, not {n}");
        let _building = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
        remove_leftovers();
        let pid = std::process::id();
        let run = format!(
            "{PREFIX}{pid:x}x{}",
            RUNS.fetch_add(1, Ordering::Relaxed) % 100
        );
        let used = ip(&["-o", "-4", "addr", "show"])?;
        let subnet = (0..=255u32)
            .map(|k| {
                let x = pid.wrapping_add(k);
                [200 + (x / 256 % 50) as u8, (x % 256) as u8]
            })
            .find(|[a, b]| !used.contains(&format!(" 10.{a}.{b}.")))
            .ok_or_else(|| anyhow::anyhow!("no free 10.x.y.0/24 subnet"))?;
        let net = Netns {
            run,
            subnet,
            nodes: (1..=n).collect(),
        };
        // From here on, drop cleans up whatever was made.
        net.build()?;
        Ok(net)
    }

    fn build(&self) -> anyhow::Result<()> {
        let br = self.bridge();
        ip(&["link", "add", &br, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{}/24", self.host_ip()), "dev", &br])?;
        ip(&["link", "set", &br, "up"])?;
        for &id in &self.nodes {
            let ns = self.ns(id);
            let (outer, inner) = (format!("{}-v{id}", self.run), format!("{}-p{id}", self.run));
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["-n", &ns, "link", "set", &inner, "name", "eth0"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", self.ip(id)),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&["link", "set", &outer, "master", &br, "up"])?;
        }
        Ok(())
    }

    /// The namespace of node `id`.
    pub fn ns(&self, id: u64) -> String {
        format!("{}-n{id}", self.run)
    }

    fn bridge(&self) -> String {
        format!("{}-br", self.run)
    }

    /// Node `id`'s address.
    pub fn ip(&self, id: u64) -> Ipv4Addr {
        let [a, b] = self.subnet;
        Ipv4Addr::new(10, a, b, id as u8)
    }

    /// The root namespace's address on the bridge.
    pub fn host_ip(&self) -> Ipv4Addr {
        let [a, b] = self.subnet;
        Ipv4Addr::new(10, a, b, HOST)
    }

    /// Node `id`'s agent address (`10.a.b.id:7000`).
    pub fn agent_addr(&self, id: u64) -> String {
        format!("{}:{AGENT_PORT}", self.ip(id))
    }

    /// The command prefix that runs a program inside node `id`'s namespace.
    pub fn exec_prefix(&self, id: u64) -> Vec<String> {
        ["ip", "netns", "exec"]
            .into_iter()
            .map(str::to_owned)
            .chain([self.ns(id)])
            .collect()
    }

    /// Every node, with its agent address and command prefix, for `Cluster::start_placed`.
    pub fn placements(&self) -> Vec<gpu_tests::Placement> {
        self.nodes
            .iter()
            .map(|&id| gpu_tests::Placement {
                addr: self.agent_addr(id),
                prefix: self.exec_prefix(id),
            })
            .collect()
    }

    /// Run `args` inside node `id`'s namespace, feeding `stdin`; fails on a non-zero exit.
    pub fn exec(&self, id: u64, args: &[&str], stdin: &str) -> anyhow::Result<()> {
        use std::io::Write;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns(id)])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow::anyhow!("ip netns exec {}: {e}", self.ns(id)))?;
        if let Some(mut input) = child.stdin.take() {
            input.write_all(stdin.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        anyhow::ensure!(
            out.status.success(),
            "{args:?} in {}: {}",
            self.ns(id),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        remove_run(&self.run);
    }
}

fn probe() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not running as root (network namespaces need it)".into());
    }
    for (tool, args) in [("ip", &["netns", "list"][..]), ("nft", &["--version"][..])] {
        let ok = Command::new(tool)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Some(format!(
                "`{tool}` is missing or fails (install iproute2 and nftables)"
            ));
        }
    }
    let ns = format!("{PREFIX}{:x}x99-probe", std::process::id());
    let tried = ip(&["netns", "add", &ns])
        .and_then(|_| ip(&["netns", "exec", &ns, "nft", "list", "ruleset"]));
    ip(&["netns", "del", &ns]).ok();
    tried
        .err()
        .map(|e| format!("cannot use a network namespace with nft here: {e:#}"))
}

/// `ip args…`, returning stdout; fails with stderr on a non-zero exit.
fn ip(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| anyhow::anyhow!("ip {}: {e}", args.join(" ")))?;
    anyhow::ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The run a name of ours belongs to (`gm1a2bx0-n3` → `gm1a2bx0`) and the pid that made it.
fn parse_run(name: &str) -> Option<(&str, u32)> {
    let run = name.split('-').next()?;
    let (pid, n) = run.strip_prefix(PREFIX)?.split_once('x')?;
    n.parse::<u32>().ok()?;
    Some((run, u32::from_str_radix(pid, 16).ok()?))
}

/// Names of our namespaces and root-namespace links (`ip -o link` writes `3: name@peer: …`).
fn our_names() -> (Vec<String>, Vec<String>) {
    let names = |out: anyhow::Result<String>, field: usize| -> Vec<String> {
        out.unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(field))
            .map(|n| {
                n.trim_end_matches(':')
                    .split('@')
                    .next()
                    .unwrap_or("")
                    .to_owned()
            })
            .filter(|n| parse_run(n).is_some())
            .collect()
    };
    (
        names(ip(&["netns", "list"]), 0),
        names(ip(&["-o", "link", "show"]), 1),
    )
}

/// Remove every namespace and link of runs whose process is gone.
fn remove_leftovers() {
    let (namespaces, links) = our_names();
    let mut runs: Vec<&str> = namespaces
        .iter()
        .chain(&links)
        .filter_map(|n| parse_run(n))
        .filter(|(_, pid)| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        .map(|(run, _)| run)
        .collect();
    runs.sort_unstable();
    runs.dedup();
    for run in runs {
        eprintln!("netns: removing the leftovers of run {run}");
        remove_run(run);
    }
}

/// Kill what still runs in `run`'s namespaces (agents and jobs a killed test left behind),
/// then delete the namespaces and the root-namespace links. Best effort: errors are ignored.
fn remove_run(run: &str) {
    let (namespaces, links) = our_names();
    for ns in namespaces
        .iter()
        .filter(|n| parse_run(n).is_some_and(|(r, _)| r == run))
    {
        for pid in ip(&["netns", "pids", ns])
            .unwrap_or_default()
            .split_whitespace()
        {
            if let Ok(pid) = pid.parse::<i32>() {
                kill(Pid::from_raw(pid), Signal::SIGKILL).ok();
            }
        }
        ip(&["netns", "del", ns]).ok();
    }
    for link in links
        .iter()
        .filter(|n| parse_run(n).is_some_and(|(r, _)| r == run))
    {
        ip(&["link", "del", link]).ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_to_their_run() {
        assert_eq!(parse_run("gm1a2bx0-n3"), Some(("gm1a2bx0", 0x1a2b)));
        assert_eq!(parse_run("gm1a2bx12-br"), Some(("gm1a2bx12", 0x1a2b)));
        assert_eq!(parse_run("eth0"), None);
        assert_eq!(parse_run("gmail-n1"), None);
    }

    #[test]
    fn namespaces_reach_each_other_and_the_host_and_are_removed() {
        if let Some(why) = Netns::unavailable() {
            println!("skipping: {why}");
            return;
        }
        let net = Netns::create(2).expect("create namespaces");
        // The root namespace listens on the bridge; node 1 connects to it from inside.
        let listener = std::net::TcpListener::bind((net.host_ip(), 0)).expect("bind on bridge");
        let port = listener.local_addr().expect("addr").port();
        let connect = format!("exec 3<>/dev/tcp/{}/{port}", net.host_ip());
        net.exec(1, &["timeout", "5", "bash", "-c", &connect], "")
            .expect("node 1 reaches the host over the bridge");
        // The root namespace's loopback is not node 2's.
        let local = std::net::TcpListener::bind("127.0.0.1:0").expect("bind on loopback");
        let port = local.local_addr().expect("addr").port();
        let other = format!("exec 3<>/dev/tcp/127.0.0.1/{port}");
        assert!(
            net.exec(2, &["timeout", "5", "bash", "-c", &other], "")
                .is_err()
        );
        let run = net.run.clone();
        drop(net);
        let (namespaces, links) = our_names();
        assert!(
            !namespaces.iter().chain(&links).any(|n| n.starts_with(&run)),
            "left behind: {namespaces:?} {links:?}"
        );
    }
}
