//! Criterion benchmark of one scheduler pass: 10,000 pending jobs on 5,000 nodes × 8 GPUs,
//! the setup of `gpu-agent bench-plan` (`simulate::bench::setup`), under three policies.

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_agent::scheduler::{Policy, plan};
use gpu_agent::tools::simulate::bench;

fn one_pass(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_10k_jobs_5k_nodes");
    group.sample_size(10);
    for spec in ["priority+greedy", "sjf+easy", "fairshare+easy"] {
        let policy: Policy = spec.parse().expect("a valid policy");
        let setup = bench::setup(5_000, 8, 10_000, &policy, 1).expect("the bench cluster");
        group.bench_function(spec, |b| {
            b.iter(|| plan(&setup.state, &setup.policy, &setup.env))
        });
    }
    group.finish();
}

criterion_group!(benches, one_pass);
criterion_main!(benches);
