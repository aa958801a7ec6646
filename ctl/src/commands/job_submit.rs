//! `gpuctl job submit`: flags → `SubmitJobRequest`, then one idempotent call.
//!
//! Every submission carries an idempotency key (the user's, or a random one), so the endpoint
//! failover in `client.rs` can retry it on another agent without queueing the job twice.

use std::collections::HashMap;
use std::path::Path;

use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;
use serde_json::json;

use super::{Answer, Ctx, Failure, batch_script};
use crate::cli::{KindArg, SubmitArgs};

/// The server's limit on job names.
const NAME_MAX: usize = 128;

pub(super) async fn run(ctx: &Ctx, args: SubmitArgs) -> Result<Answer, Failure> {
    let reply = submit(ctx, args).await?;
    Ok(ctx.answer(
        || json!({ "job_id": reply.job_id, "existing": reply.existing }),
        || format!("j-{}\n", reply.job_id),
    ))
}

/// Submit the job the flags describe (`job submit`, `run`).
pub(super) async fn submit(ctx: &Ctx, args: SubmitArgs) -> Result<pb::SubmitJobResponse, Failure> {
    let user_key = args.idempotency_key.is_some();
    let req = request(args, random_key).map_err(Failure::Usage)?;
    let key = req.idempotency_key.clone();
    let reply = ctx
        .call(JobServiceClient::new, req, async |mut c, r| {
            c.submit_job(r).await
        })
        .await?;
    // With a generated key, `existing` only means our own failover found the first attempt's
    // job: nothing the user needs to hear about.
    if reply.existing && user_key {
        eprintln!(
            "job j-{} already existed (idempotency key {:?})",
            reply.job_id, key
        );
    }
    Ok(reply)
}

/// 128 random bits, hex.
fn random_key() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The request the flags describe. Fails only on what the server could not tell apart: a key
/// given twice to `--env` or `--selector` (a map would keep just one of them).
fn request(
    mut args: SubmitArgs,
    new_key: impl FnOnce() -> String,
) -> Result<pb::SubmitJobRequest, String> {
    if let Some(path) = args.script.take() {
        let script = batch_script::load(&path, &args.command)?;
        for warning in batch_script::apply(&script.directives, &mut args)? {
            eprintln!("warning: {warning}");
        }
        args.command = script.command;
        if args.name.is_none() {
            args.name = Some(default_name(&path.to_string_lossy()));
        }
    }
    let name = match args.name {
        Some(name) => name,
        None => default_name(args.command.first().map_or("", String::as_str)),
    };
    let slice = args.mig.is_some() || args.gpu_mem.is_some();
    let spec = pb::JobSpec {
        name,
        tenant: args.tenant.unwrap_or_default(),
        command: args.command,
        env: unique_map("--env", args.env)?,
        workdir: args.workdir.unwrap_or_default(),
        gpus: match args.gpus_per_node {
            Some(per) => per.saturating_mul(args.nodes.max(1)),
            // A slice is one slice of one GPU: `--mig 1g.10gb` alone means `--gpus 1`.
            None if slice && args.gpus == 0 => 1,
            None => args.gpus,
        },
        nodes: args.nodes,
        topology: args.topology.unwrap_or_default(),
        mig_profile: args.mig.unwrap_or_default(),
        shared_memory_mib: args.gpu_mem.unwrap_or(0),
        gpu_share: args.gpu_share.unwrap_or(0),
        kind: match args.kind {
            KindArg::Process => String::new(),
            KindArg::Vm => "vm".into(),
        },
        gpu_types: args.gpu_types,
        min_gpu_memory_mib: args.min_gpu_memory.unwrap_or(0),
        node_selector: unique_map("--selector", args.selectors)?,
        labels: unique_map("--label", args.labels)?,
        notify_url: args.notify.unwrap_or_default(),
        notify_events: args.notify_on,
        priority: args.priority,
        runtime_estimate_s: args.estimate,
        wall_time_limit_s: args.wall_time,
        max_attempts: args.max_attempts.unwrap_or(0),
        cpu_millis: args.cpus,
        memory_mib: args.memory,
        retry_backoff_s: args.retry_backoff,
        after: args.after,
        singleton: args.singleton,
        array: args.array.unwrap_or_default(),
        container: match args.image {
            None => None,
            Some(image) => Some(pb::ContainerSpec {
                image,
                mounts: args
                    .mounts
                    .iter()
                    .map(|m| container_mount(m))
                    .collect::<Result<_, _>>()?,
            }),
        },
    };
    Ok(pb::SubmitJobRequest {
        spec: Some(spec),
        idempotency_key: args.idempotency_key.unwrap_or_else(new_key),
        hold: args.hold,
    })
}

/// `SRC:DST[:ro]` as the API takes it (the paths are judged by the cluster).
fn container_mount(flag: &str) -> Result<pb::ContainerMount, String> {
    let parts: Vec<&str> = flag.split(':').collect();
    let (source, target, read_only) = match parts.as_slice() {
        [src, dst] | [src, dst, "rw"] => (src, dst, false),
        [src, dst, "ro"] => (src, dst, true),
        _ => return Err(format!("--mount {flag:?} is not SRC:DST[:ro]")),
    };
    Ok(pb::ContainerMount {
        source: (*source).to_owned(),
        target: (*target).to_owned(),
        read_only,
    })
}

fn unique_map(flag: &str, pairs: Vec<(String, String)>) -> Result<HashMap<String, String>, String> {
    let mut map = HashMap::with_capacity(pairs.len());
    for (k, v) in pairs {
        if map.contains_key(&k) {
            return Err(format!("{flag} {k:?} is given more than once"));
        }
        map.insert(k, v);
    }
    Ok(map)
}

/// A job name from the program: its file name with characters outside `[A-Za-z0-9._-]`
/// replaced by `-`, leading non-alphanumerics dropped, at most 128 characters; `job` if
/// nothing is left.
fn default_name(program: &str) -> String {
    let base = Path::new(program)
        .file_name()
        .map_or_else(|| program.into(), |b| b.to_string_lossy());
    let cleaned: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name: String = cleaned
        .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .chars()
        .take(NAME_MAX)
        .collect();
    if name.is_empty() { "job".into() } else { name }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, JobVerb, Noun};

    fn args(flags: &[&str]) -> SubmitArgs {
        let argv = ["gpuctl", "job", "submit"].iter().chain(flags);
        match Cli::try_parse_from(argv).expect("parses").command {
            Noun::Job(JobVerb::Submit(a)) => *a,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn names_derive_from_the_program() {
        for (program, name) in [
            ("python3", "python3"),
            ("/usr/bin/python3", "python3"),
            ("./train.py", "train.py"),
            ("/opt/my tool/run it", "run-it"),
            ("--weird", "weird"),
            (".hidden", "hidden"),
            ("_x", "x"),
            ("bin/", "bin"),
            ("naïve", "na-ve"),
            ("日本", "job"),
            ("...", "job"),
            ("/", "job"),
            ("", "job"),
            ("a\nb", "a-b"),
        ] {
            assert_eq!(default_name(program), name, "{program:?}");
        }
        assert_eq!(default_name(&"x".repeat(10_000)).len(), NAME_MAX);
    }

    #[test]
    fn flags_become_the_request() {
        let req = request(
            args(&[
                "--gpus",
                "2",
                "--env",
                "A=1",
                "--selector",
                "zone=a",
                "--wall-time",
                "1h",
                "--cpus",
                "0.5",
                "--memory",
                "2G",
                "--",
                "/usr/bin/python3",
                "-c",
                "print(1)",
            ]),
            || "generated".into(),
        )
        .expect("valid");
        let spec = req.spec.expect("spec");
        assert_eq!(spec.name, "python3");
        assert_eq!(spec.tenant, "");
        assert_eq!(spec.command, ["/usr/bin/python3", "-c", "print(1)"]);
        assert_eq!(spec.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(
            spec.node_selector.get("zone").map(String::as_str),
            Some("a")
        );
        assert_eq!((spec.gpus, spec.wall_time_limit_s), (2, Some(3600)));
        assert_eq!((spec.runtime_estimate_s, spec.max_attempts), (None, 0));
        assert_eq!((spec.cpu_millis, spec.memory_mib), (Some(500), Some(2048)));
        assert_eq!(req.idempotency_key, "generated");
    }

    #[test]
    fn an_image_and_its_mounts_become_the_request() {
        let spec = request(
            args(&[
                "--image",
                "localhost/train:1",
                "--mount",
                "/data/a:/data",
                "--mount",
                "/models:/models:ro",
                "--",
                "python",
            ]),
            random_key,
        )
        .expect("valid")
        .spec
        .expect("spec");
        let c = spec.container.expect("a container");
        assert_eq!(c.image, "localhost/train:1");
        let mounts: Vec<_> = c
            .mounts
            .iter()
            .map(|m| (m.source.as_str(), m.target.as_str(), m.read_only))
            .collect();
        assert_eq!(
            mounts,
            [("/data/a", "/data", false), ("/models", "/models", true)]
        );
        assert!(
            request(args(&["--", "x"]), random_key)
                .expect("valid")
                .spec
                .expect("valid")
                .container
                .is_none()
        );
        let e = request(
            args(&["--image", "x", "--mount", "/a", "--", "x"]),
            random_key,
        )
        .expect_err("refused");
        assert!(e.contains("SRC:DST"), "{e}");
    }

    #[test]
    fn limits_are_absent_unless_given() {
        let spec = request(args(&["--", "x"]), random_key)
            .expect("valid")
            .spec
            .expect("spec");
        assert_eq!((spec.cpu_millis, spec.memory_mib), (None, None));
        assert_eq!(spec.retry_backoff_s, None, "the server picks the default");
    }

    #[test]
    fn retries_and_time_limits_become_the_request() {
        let spec = request(
            args(&[
                "--max-attempts",
                "3",
                "--retry-backoff",
                "1m",
                "--time-limit",
                "2s",
                "--",
                "x",
            ]),
            random_key,
        )
        .expect("valid")
        .spec
        .expect("spec");
        assert_eq!(
            (
                spec.max_attempts,
                spec.retry_backoff_s,
                spec.wall_time_limit_s
            ),
            (3, Some(60), Some(2))
        );
    }

    #[test]
    fn a_given_name_and_key_are_kept() {
        let req = request(
            args(&["--name", "../odd", "--idempotency-key", "k", "--", "x"]),
            || unreachable!("no key needed"),
        )
        .expect("valid");
        assert_eq!(req.spec.map(|s| s.name).as_deref(), Some("../odd"));
        assert_eq!(req.idempotency_key, "k");
    }

    #[test]
    fn duplicate_keys_are_refused() {
        let err = request(
            args(&["--env", "A=1", "--env", "A=2", "--", "x"]),
            random_key,
        )
        .expect_err("duplicate");
        assert!(err.contains("--env \"A\""), "{err}");
        assert!(
            request(
                args(&["--selector", "z=a", "--selector", "z=a", "--", "x"]),
                random_key
            )
            .is_err()
        );
    }

    #[test]
    fn slices_and_vms_become_the_request() {
        let spec = |flags: &[&str]| {
            request(args(flags), random_key)
                .expect("valid")
                .spec
                .expect("spec")
        };
        let mig = spec(&["--mig", "1g.10gb", "--", "x"]);
        assert_eq!((mig.mig_profile.as_str(), mig.gpus), ("1g.10gb", 1));
        assert_eq!((mig.shared_memory_mib, mig.gpu_share), (0, 0));
        let shared = spec(&["--gpu-mem", "10GiB", "--gpu-share", "25", "--", "x"]);
        assert_eq!(
            (shared.shared_memory_mib, shared.gpu_share, shared.gpus),
            (10_240, 25, 1)
        );
        assert_eq!(shared.mig_profile, "");
        // An explicit --gpus is passed on for the server to refuse with its reason.
        assert_eq!(
            spec(&["--gpus", "2", "--mig", "1g.10gb", "--", "x"]).gpus,
            2
        );
        let vm = spec(&["--kind", "vm", "--gpus", "2", "--", "x"]);
        assert_eq!((vm.kind.as_str(), vm.gpus), ("vm", 2));
        assert_eq!(spec(&["--", "x"]).kind, "");
    }

    #[test]
    fn bad_slice_flags_are_refused_with_the_reason() {
        use crate::cli::Cli;
        for (flags, reason) in [
            (&["--gpu-share", "101", "--gpu-mem", "1G"][..], "101"),
            (
                &["--gpu-share", "0", "--gpu-mem", "1G"][..],
                "0 is not in 1..=100",
            ),
            (&["--gpu-share", "25"][..], "--gpu-mem"),
            (&["--gpu-mem", "1G"][..], "--gpu-share"),
            (&["--gpu-mem", "lots", "--gpu-share", "5"][..], "lots"),
            (
                &["--mig", "1g.10gb", "--gpu-mem", "1G", "--gpu-share", "5"][..],
                "cannot be used",
            ),
            (&["--mig", ""][..], "--mig"),
            (&["--kind", "vm", "--mig", "1g.10gb"][..], "cannot be used"),
            (&["--kind", "container"][..], "container"),
            (&["--mount", "/a:/b"][..], "--image"),
        ] {
            let argv = ["gpuctl", "job", "submit"]
                .iter()
                .chain(flags)
                .chain(&["--", "x"]);
            let err = Cli::try_parse_from(argv).expect_err("refused").to_string();
            assert!(err.contains(reason), "{flags:?}: {err}");
        }
    }

    #[test]
    fn generated_keys_are_128_random_bits() {
        let (a, b) = (random_key(), random_key());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
