//! GPU partitioning on a real agent with 4 simulated A100-80GB GPUs: a mixed queue of whole-GPU,
//! MIG and shared jobs completes with no GPU over-committed at any moment; a restarted agent
//! restores its MIG layout; a layout change on a busy GPU waits for the job; bad requests are
//! refused with the reason and change nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::gpu_service_client::GpuServiceClient;
use gpu_raft_store::mig::{self, Instance};
use gpu_tests::records::{self, RunRecord};
use gpu_tests::{Cluster, is_terminal, shell_job};

const A100: &str = "A100-80GB";
const A100_MIB: u64 = 81_920;

async fn partition(
    c: &Cluster,
    gpu: u32,
    mode: &str,
    layout: &[&str],
) -> Result<pb::Gpu, tonic::Status> {
    let mut n = GpuServiceClient::new(c.channel(1).await?);
    Ok(n.set_gpu_partition(pb::SetGpuPartitionRequest {
        node_id: 1,
        gpu_index: gpu,
        mode: mode.into(),
        mig: layout.iter().map(|s| (*s).to_owned()).collect(),
    })
    .await?
    .into_inner())
}

async fn gpus(c: &Cluster) -> Vec<pb::Gpu> {
    c.node(1, 1, false).await.expect("node 1").gpus
}

fn mig_job(name: &str, profile: &str, script: &str) -> pb::JobSpec {
    pb::JobSpec {
        mig_profile: profile.into(),
        ..shell_job(name, 1, script)
    }
}

fn shared_job(name: &str, mib: u64, share: u32, script: &str) -> pb::JobSpec {
    pb::JobSpec {
        shared_memory_mib: mib,
        gpu_share: share,
        ..shell_job(name, 1, script)
    }
}

/// What a job held on its GPU, parsed from `Job.slice` ("mig 1g.10gb@3", "shared 20480MiB/30%").
#[derive(Debug, Clone)]
enum Held {
    Whole,
    Mig(Instance),
    Shared(u64, u32),
}

fn held(j: &pb::Job) -> Held {
    if let Some(rest) = j.slice.strip_prefix("mig ") {
        let (profile, start) = rest.split_once('@').expect("profile@start");
        return Held::Mig(Instance {
            profile: profile.into(),
            start: start.parse().expect("start"),
        });
    }
    if let Some(rest) = j.slice.strip_prefix("shared ") {
        let (mib, share) = rest.split_once("MiB/").expect("MiB/");
        return Held::Shared(
            mib.parse().expect("mib"),
            share.trim_end_matches('%').parse().expect("share"),
        );
    }
    assert!(j.slice.is_empty(), "unknown slice {:?}", j.slice);
    Held::Whole
}

/// At every run's start, the runs then live on each GPU must fit it.
fn assert_never_over_committed(runs: &[(pb::Job, RunRecord)]) {
    let table = mig::model(A100).expect("A100-80GB is MIG-capable");
    for (_, at) in runs {
        let t = at.start_ns;
        let mut per_gpu: BTreeMap<u32, Vec<Held>> = BTreeMap::new();
        for (j, r) in runs {
            let live = r.start_ns <= t && r.end_ns.is_none_or(|e| e > t);
            if live {
                for g in &j.gpus {
                    per_gpu.entry(*g).or_default().push(held(j));
                }
            }
        }
        for (gpu, held) in per_gpu {
            let whole = held.iter().filter(|h| matches!(h, Held::Whole)).count();
            assert!(
                whole == 0 || held.len() == 1,
                "GPU {gpu} shared by a whole-GPU job: {held:?}"
            );
            let instances: Vec<Instance> = held
                .iter()
                .filter_map(|h| match h {
                    Held::Mig(i) => Some(i.clone()),
                    _ => None,
                })
                .collect();
            table.check(&instances).unwrap_or_else(|e| {
                panic!("GPU {gpu}: MIG slices {instances:?} break the rules: {e}")
            });
            let (mib, share) = held.iter().fold((0, 0), |(m, s), h| match h {
                Held::Shared(a, b) => (m + a, s + b),
                _ => (m, s),
            });
            assert!(
                mib <= A100_MIB,
                "GPU {gpu}: shared memory {mib} MiB over-committed"
            );
            assert!(share <= 100, "GPU {gpu}: shares sum to {share}%");
            let kinds = [
                whole > 0,
                !instances.is_empty(),
                held.iter().any(|h| matches!(h, Held::Shared(..))),
            ];
            assert!(
                kinds.iter().filter(|k| **k).count() <= 1,
                "GPU {gpu} mixes kinds: {held:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_queue_completes_without_over_commit_and_layouts_survive_restart() {
    let mut c = Cluster::start(1, 1, "").await;
    let dir = records::prepare_dir(c.root.path()).expect("records dir");
    let sleep = records::script(&dir, "0.5");
    let seven = ["1g.10gb"; 7];
    partition(&c, 1, "mig", &seven).await.expect("mig layout");
    partition(&c, 2, "shared", &[]).await.expect("shared mode");

    let mut specs = Vec::new();
    for i in 0..4 {
        specs.push(shell_job(&format!("whole-{i}"), 1, &sleep));
    }
    for i in 0..10 {
        specs.push(mig_job(&format!("mig-{i}"), "1g.10gb", &sleep));
    }
    for i in 0..8 {
        specs.push(shared_job(&format!("shared-{i}"), 20_480, 30, &sleep));
    }
    let mut ids = Vec::new();
    for (i, s) in specs.into_iter().enumerate() {
        ids.push(
            c.submit(1, s, &format!("k-{i}"))
                .await
                .expect("submit")
                .job_id,
        );
    }
    let mut runs = Vec::new();
    for id in ids {
        let j = c.wait_job(id, Duration::from_secs(120), is_terminal).await;
        assert_eq!(
            j.state,
            pb::JobState::Succeeded as i32,
            "j-{id}: {} {}",
            j.reason,
            j.outcome
        );
        let r = records::read(&dir, id, j.generation).expect("run record");
        let spec = j.spec.clone().expect("spec");
        // Re-slicing may turn an idle GPU whole or MIG as the queue asks; shared stays shared.
        let want = if !spec.mig_profile.is_empty() {
            "MIG-"
        } else {
            "GPU-"
        };
        assert!(
            !r.gpus.is_empty() && r.gpus.iter().all(|g| g.starts_with(want)),
            "j-{id} ({:?}): CUDA_VISIBLE_DEVICES {:?}",
            j.slice,
            r.gpus
        );
        if spec.gpu_share > 0 {
            assert_eq!(j.gpus, [2], "shared jobs only on the shared GPU");
        } else {
            assert_ne!(j.gpus, [2], "nothing but shared jobs on the shared GPU");
        }
        runs.push((j, r));
    }
    assert_never_over_committed(&runs);

    // A restarted agent re-creates its MIG devices from the replicated layout.
    partition(&c, 1, "mig", &["3g.40gb", "2g.20gb", "1g.10gb"])
        .await
        .expect("idle GPU takes a layout at once");
    let layout = gpus(&c).await[1].mig_layout.clone();
    assert_eq!(layout.len(), 3, "{layout:?}");
    c.kill(1);
    c.start_agent(1);
    c.wait_serving().await;
    assert_eq!(gpus(&c).await[1].mig_layout, layout);
    let id = c
        .submit(1, mig_job("after-restart", "2g.20gb", &sleep), "k-after")
        .await
        .expect("submit")
        .job_id;
    let j = c.wait_job(id, Duration::from_secs(60), is_terminal).await;
    assert_eq!(
        j.state,
        pb::JobState::Succeeded as i32,
        "{} {}",
        j.reason,
        j.outcome
    );
    assert_eq!(j.gpus, [1], "on the restored 2g.20gb instance");
    let r = records::read(&dir, id, j.generation).expect("run record");
    assert!(
        r.gpus.iter().all(|g| g.starts_with("MIG-")) && !r.gpus.is_empty(),
        "{:?}",
        r.gpus
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_change_on_a_busy_gpu_waits_for_the_job() {
    let c = Cluster::start(1, 1, "").await;
    let dir = records::prepare_dir(c.root.path()).expect("records dir");
    partition(&c, 0, "mig", &["7g.80gb"])
        .await
        .expect("mig layout");
    let id = c
        .submit(
            1,
            mig_job("busy", "7g.80gb", &records::script(&dir, "3")),
            "k-busy",
        )
        .await
        .expect("submit")
        .job_id;
    c.wait_job(id, Duration::from_secs(60), |j| {
        j.state == pb::JobState::Running as i32
    })
    .await;
    partition(&c, 0, "mig", &["3g.40gb", "3g.40gb"])
        .await
        .expect("accepted, deferred");
    let g = gpus(&c).await.remove(0);
    assert_eq!(
        g.mig_layout,
        ["7g.80gb@0"],
        "layout must not change under a running job"
    );
    assert!(!g.pending_partition.is_empty(), "the change waits: {g:?}");
    let j = c.wait_job(id, Duration::from_secs(60), is_terminal).await;
    assert_eq!(
        j.state,
        pb::JobState::Succeeded as i32,
        "never killed: {} {}",
        j.reason,
        j.outcome
    );
    let r = records::read(&dir, id, j.generation).expect("run record");
    assert!(r.end_ns.is_some(), "the job ran to its end");
    c.wait_for(
        "layout applied after drain",
        Duration::from_secs(30),
        |c| async move {
            let g = gpus(c).await.remove(0);
            g.mig_layout.len() == 2 && g.pending_partition.is_empty()
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_partition_requests_are_refused_with_the_reason_and_change_nothing() {
    let c = Cluster::start(1, 1, "").await;
    partition(&c, 1, "mig", &["1g.10gb"])
        .await
        .expect("mig layout");
    let before_gpus = gpus(&c).await;
    let before_jobs = c.list_jobs(1).await.expect("jobs").len();
    let refused = |r: Result<pb::SubmitJobResponse, tonic::Status>, want: &str| {
        let e = r.expect_err("must be refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains(want),
            "{:?} should say {want:?}",
            e.message()
        );
    };
    let job = |s| c.submit(1, s, "");
    refused(
        job(mig_job("a", "1g.5gb", "true")).await,
        "A100-80GB supports 1g.10gb",
    );
    refused(
        job(pb::JobSpec {
            gpu_types: vec!["A100".into()],
            ..mig_job("b", "1g.5gb", "true")
        })
        .await,
        "not supported by any A100 GPU",
    );
    refused(
        job(mig_job("c", "9g.90gb", "true")).await,
        "unknown MIG profile",
    );
    refused(job(shared_job("d", 1024, 101, "true")).await, "1..=100");
    refused(job(shared_job("e", 1024, 0, "true")).await, "1..=100");
    refused(
        job(shared_job("f", 102_400, 25, "true")).await,
        "more than any GPU in the cluster",
    );
    refused(
        job(pb::JobSpec {
            gpu_types: vec!["A100".into()],
            ..shared_job("g", 90_000, 25, "true")
        })
        .await,
        "more than any A100 GPU",
    );
    let e = partition(&c, 1, "mig", &["1g.5gb"])
        .await
        .expect_err("unsupported layout");
    assert!(e.message().contains("1g.5gb"), "{e:?}");
    let e = partition(&c, 9, "mig", &["1g.10gb"])
        .await
        .expect_err("unknown GPU");
    assert!(!e.message().is_empty(), "{e:?}");
    let e = partition(&c, 1, "sliced", &[])
        .await
        .expect_err("unknown mode");
    assert!(e.message().contains("sliced"), "{e:?}");
    assert_eq!(
        c.list_jobs(1).await.expect("jobs").len(),
        before_jobs,
        "no job recorded"
    );
    let after = gpus(&c).await;
    let view = |g: &[pb::Gpu]| {
        g.iter()
            .map(|g| {
                (
                    g.mode.clone(),
                    g.mig_layout.clone(),
                    g.pending_partition.clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(view(&after), view(&before_gpus), "partitions unchanged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_jobs_get_pass_through_gpus_by_pci_address_and_run_no_process() {
    let mut c = Cluster::start(1, 1, "").await;
    let dir = records::prepare_dir(c.root.path()).expect("records dir");
    partition(&c, 3, "passthrough", &[])
        .await
        .expect("passthrough mode");
    let vm = |name: &str, wall: Option<u64>| pb::JobSpec {
        kind: "vm".into(),
        wall_time_limit_s: wall,
        // Were this run as a process, it would leave a record.
        ..shell_job(name, 1, &records::script(&dir, "0.1"))
    };
    let timed = c
        .submit(1, vm("vm-wall", Some(2)), "k-vm1")
        .await
        .expect("submit")
        .job_id;
    let j = c
        .wait_job(timed, Duration::from_secs(60), |j| {
            j.state == pb::JobState::Running as i32
        })
        .await;
    assert_eq!(j.gpus, [3], "vm jobs only on the pass-through GPU");
    let j = c
        .wait_job(timed, Duration::from_secs(60), is_terminal)
        .await;
    assert!(
        j.outcome.contains("time limit"),
        "ended by its wall limit: {} {}",
        j.state,
        j.outcome
    );
    let held = c
        .submit(1, vm("vm-cancel", None), "k-vm2")
        .await
        .expect("submit")
        .job_id;
    c.wait_job(held, Duration::from_secs(60), |j| {
        j.state == pb::JobState::Running as i32
    })
    .await;
    // Process jobs never go on the pass-through GPU, even with the others busy.
    let mut procs = Vec::new();
    for i in 0..3 {
        let s = shell_job(&format!("p-{i}"), 1, &records::script(&dir, "2"));
        procs.push(
            c.submit(1, s, &format!("k-p{i}"))
                .await
                .expect("submit")
                .job_id,
        );
    }
    let extra = c
        .submit(1, shell_job("p-extra", 1, "true"), "k-px")
        .await
        .expect("submit")
        .job_id;
    for id in procs {
        let j = c.wait_job(id, Duration::from_secs(60), is_terminal).await;
        assert_eq!(j.state, pb::JobState::Succeeded as i32, "{}", j.outcome);
        assert_ne!(j.gpus, [3], "a process job on the pass-through GPU");
    }
    let j = c
        .wait_job(extra, Duration::from_secs(60), is_terminal)
        .await;
    assert_ne!(j.gpus, [3], "a process job on the pass-through GPU");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        c.job(1, held).await.expect("job").state,
        pb::JobState::Running as i32,
        "a vm runs until cancelled"
    );
    // A restarted agent keeps the vm run (its record is the job directory), attached once.
    c.kill(1);
    c.start_agent(1);
    c.wait_serving().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        c.job(1, held).await.expect("job").state,
        pb::JobState::Running as i32,
        "a vm survives its agent's restart"
    );
    // The run's stdout names the PCI address it was given (read while it runs).
    let j = c.job(1, held).await.expect("job");
    let logs = std::fs::read_to_string(c.run_dir(1, held, j.generation).join("stdout.log"))
        .expect("the vm run's stdout");
    assert!(logs.starts_with("vm: pass-through GPUs at "), "{logs:?}");
    assert_eq!(logs.lines().count(), 1, "attached once: {logs:?}");
    let pci = logs
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_owned();
    assert!(
        pci.contains(':') && pci.contains('.'),
        "a PCI address: {pci:?}"
    );
    c.cancel(1, held).await.expect("cancel");
    let j = c.wait_job(held, Duration::from_secs(60), is_terminal).await;
    assert_eq!(j.state, pb::JobState::Cancelled as i32, "{}", j.outcome);
    for id in [timed, held] {
        assert!(
            records::read(&dir, id, 1).is_err() && records::read(&dir, id, 0).is_err(),
            "j-{id} ran as a process"
        );
    }
}
