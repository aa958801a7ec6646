#!/usr/bin/env bash
# Regenerate every table and chart of docs/scheduling.md from the Philly trace: each run writes
# NAME.txt (the table in the doc), NAME.json, NAME.svg and NAME.log (replay times) under
# docs/scheduling/. Release build; about 15 minutes on a 2-core machine.
#
#   scripts/scheduling-tables.sh [TRACE]      # default ../shared/traces/philly.csv
set -euo pipefail
cd "$(dirname "$0")/.."
trace=${1:-../shared/traces/philly.csv}
out=docs/scheduling
cargo build --release --locked --bin gpu-agent
agent=target/release/gpu-agent

run() { # NAME ARGS...
  local name=$1
  shift
  echo "== $name" >&2
  "$agent" simulate --trace "$trace" --json "$out/$name.json" --svg "$out/$name.svg" "$@" \
    > "$out/$name.txt" 2> "$out/$name.log"
  cat "$out/$name.txt"
}

run philly-56x8-predicted --cluster 56x8xV100-32GB --estimates predicted \
  --policy fcfs,fcfs+easy,fcfs+greedy,sjf,sjf+easy,priority,priority+easy,fairshare+easy,fairshare+greedy,learned+easy
run philly-56x8-exact --cluster 56x8xV100-32GB --estimates exact --policy fcfs+easy,sjf,sjf+easy
run philly-56x8-fairshare-strict --cluster 56x8xV100-32GB --policy fairshare
run philly-48x8-predicted --cluster 48x8xV100-32GB --estimates predicted \
  --policy fcfs,fcfs+easy,sjf+easy,fairshare+easy
# Fair share with guarantees: every tenant guaranteed 24 GPUs, borrowing the rest while idle,
# and quota reclaim by the leader's own preemption pass (10 minutes of work lost per stop).
run philly-56x8-reclaim --cluster 56x8xV100-32GB --estimates predicted \
  --tenants "$out/philly-tenants-24.csv" --preemption reclaim --checkpoint-cost-s 600 \
  --policy fairshare+easy,sjf+easy,learned+easy
# The same with the gang starvation guard at 24 hours.
run philly-56x8-reclaim-guard --cluster 56x8xV100-32GB --estimates predicted \
  --tenants "$out/philly-tenants-24.csv" --preemption reclaim --checkpoint-cost-s 600 \
  --gang-wait-limit-s 86400 --policy fairshare+easy
# And with runs exempt from preemption for their first 10 minutes to 4 hours.
for exempt in 600 1800 3600 7200 14400; do
  run "philly-56x8-reclaim-guard-exempt-$exempt" --cluster 56x8xV100-32GB --estimates predicted \
    --tenants "$out/philly-tenants-24.csv" --preemption reclaim --checkpoint-cost-s 600 \
    --gang-wait-limit-s 86400 --preempt-exempt-s "$exempt" --policy fairshare+easy
done
# Gangs (the trace's jobs larger than a node, run evenly over several nodes): as they are, with
# the starvation guard at 24 hours, and with the guard allowed to preempt (10 minutes lost per
# stop; no tenant has a quota, so a starving gang is the only reason to preempt).
run philly-56x8-gangs --cluster 56x8xV100-32GB --estimates predicted \
  --policy sjf+easy,fairshare+easy
run philly-56x8-gangs-guard --cluster 56x8xV100-32GB --estimates predicted \
  --gang-wait-limit-s 86400 --policy sjf+easy,fairshare+easy
run philly-56x8-gangs-guard-preempt --cluster 56x8xV100-32GB --estimates predicted \
  --gang-wait-limit-s 86400 --preemption reclaim --checkpoint-cost-s 600 \
  --policy sjf+easy,fairshare+easy,learned+easy
# Conservative backfill: a reservation for each of the first 100 jobs that cannot start.
run philly-56x8-conservative --cluster 56x8xV100-32GB --estimates predicted \
  --policy fcfs+conservative,sjf+conservative,fairshare+conservative
# GPU sharing (a synthetic trace, docs/examples/sharing-trace.csv): 16 A100s all whole, with
# every fraction taken as a whole GPU, against 8 shared and 8 whole with the fractions.
whole=$(mktemp)
cut -d, -f1-5 docs/examples/sharing-trace.csv > "$whole"
trace=$whole run sharing-whole --cluster 2x8xA100-80GB --policy fcfs+easy,sjf+easy
rm -f "$whole"
trace=docs/examples/sharing-trace.csv run sharing-shared \
  --cluster 1x8xA100-80GB:shared+1x8xA100-80GB --policy fcfs+easy,sjf+easy
# One scheduling pass: 10,000 pending jobs on 5,000 nodes, and 100,000 on 10,000 nodes.
for policy in default sjf+easy sjf+conservative fairshare+easy learned+easy; do
  args=()
  [ "$policy" = default ] || args+=(--policy "$policy")
  "$agent" bench-plan --nodes 5000 --jobs 10000 "${args[@]}" > "$out/bench-plan-${policy/+/-}.json"
  "$agent" bench-plan --nodes 10000 --jobs 100000 "${args[@]}" \
    > "$out/bench-plan-100k-${policy/+/-}.json"
done
