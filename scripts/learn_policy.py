#!/usr/bin/env python3
"""Fit the learned queue order's weights in the simulator (docs/scheduling.md, "A learned order").

The Philly trace is split by submission time: the first TRAIN_FRACTION of its jobs train, the
rest are held out. A cross-entropy search (a population of weight vectors drawn from a Gaussian,
the best few refit it, repeated) minimises the average JCT of `learned+easy` replays of the
training part with predicted runtimes, each candidate a real `gpu-agent simulate` run. The
winner is written to agent/src/scheduler/learned_weights.json (what the planner ships), and
both parts are replayed under sjf+easy and the new learned+easy for the report.

    cargo build --release --bin gpu-agent
    python3 scripts/learn_policy.py [--trace ../shared/traces/philly.csv] [--iterations 8]

Deterministic for a given --seed (the simulator is deterministic). Standard library only.
"""

import argparse
import concurrent.futures
import csv
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AGENT = os.path.join(ROOT, "target", "release", "gpu-agent")
WEIGHTS = os.path.join(ROOT, "agent", "src", "scheduler", "learned_weights.json")
CLUSTER = "56x8xV100-32GB"
# The searched weights; `runtime` stays 1 (only the ratios order jobs).
SEARCHED = ["gpus", "usage", "wait"]
UNKNOWN_RUNTIME_S = 7 * 86400.0


def clamp(name, value):
    # A negative wait weight would favour later jobs; the planner refuses it.
    return max(value, 0.0) if name == "wait" else value


def split(trace, fraction, out_dir):
    with open(trace, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], [r for r in rows[1:] if r]
    at = header.index("timestamp")
    body.sort(key=lambda r: r[at])
    cut = int(len(body) * fraction)
    parts = {}
    for name, part in (("train", body[:cut]), ("test", body[cut:])):
        path = os.path.join(out_dir, name + ".csv")
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(part)
        parts[name] = (path, len(part))
    return parts


def weights_doc(weights, about):
    return {
        "about": about,
        "weights": {
            "runtime": 1.0,
            **{k: round(weights[k], 4) for k in SEARCHED},
            "unknown_runtime_s": UNKNOWN_RUNTIME_S,
        },
    }


def simulate(trace, policies, weights_path=None):
    cmd = [AGENT, "simulate", "--trace", trace, "--cluster", CLUSTER, "--estimates",
           "predicted", "--policy", ",".join(policies), "-o", "json"]
    if weights_path:
        cmd += ["--weights", weights_path]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {r["policy"]: r for r in json.loads(out)}


def score(trace, weights, work_dir, tag):
    path = os.path.join(work_dir, f"candidate-{tag}.json")
    with open(path, "w") as f:
        json.dump(weights_doc(weights, "candidate"), f)
    return simulate(trace, ["learned+easy"], path)["learned+easy"]["avg_jct_h"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=os.path.join(ROOT, "..", "shared", "traces", "philly.csv"))
    ap.add_argument("--train-fraction", type=float, default=0.6)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--population", type=int, default=10)
    ap.add_argument("--elite", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if not os.access(AGENT, os.X_OK):
        sys.exit(f"{AGENT} is missing: cargo build --release --bin gpu-agent")
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as work:
        parts = split(args.trace, args.train_fraction, work)
        train = parts["train"][0]
        baseline = simulate(train, ["sjf+easy"])["sjf+easy"]["avg_jct_h"]
        print(f"train: {parts['train'][1]} jobs, held out: {parts['test'][1]} jobs; "
              f"sjf+easy on train: {baseline:.2f} h", flush=True)
        mean = {"gpus": 0.0, "usage": 0.0, "wait": 0.0}
        sd = {"gpus": 1.0, "usage": 2.0, "wait": 1.0}
        best = (score(train, mean, work, "start"), dict(mean))
        print(f"start {mean}: {best[0]:.2f} h", flush=True)
        for it in range(args.iterations):
            cands = [{k: clamp(k, rng.gauss(mean[k], sd[k])) for k in SEARCHED}
                     for _ in range(args.population)]
            with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
                results = list(pool.map(
                    lambda ic: (score(train, ic[1], work, f"{it}-{ic[0]}"), ic[1]),
                    enumerate(cands)))
            results.sort(key=lambda r: r[0])
            elite = [c for _, c in results[: args.elite]]
            for k in SEARCHED:
                vals = [c[k] for c in elite]
                mean[k] = statistics.fmean(vals)
                sd[k] = max(statistics.pstdev(vals), 0.05)
            if results[0][0] < best[0]:
                best = (results[0][0], dict(results[0][1]))
            print(f"iteration {it + 1}: best {results[0][0]:.2f} h, overall {best[0]:.2f} h, "
                  f"weights {({k: round(v, 3) for k, v in best[1].items()})}", flush=True)
        about = (f"fitted by scripts/learn_policy.py on the first {args.train_fraction:.0%} of "
                 f"the Philly trace (by submission), {CLUSTER}, predicted runtimes, "
                 f"learned+easy; cross-entropy search, {args.iterations} x {args.population}, "
                 f"seed {args.seed}: train avg JCT {best[0]:.2f} h against sjf+easy's "
                 f"{baseline:.2f} h")
        with open(WEIGHTS, "w") as f:
            json.dump(weights_doc(best[1], about), f, indent=2)
            f.write("\n")
        print(f"wrote {WEIGHTS}")
        for name in ("train", "test"):
            r = simulate(parts[name][0], ["sjf+easy", "learned+easy"], WEIGHTS)
            s, l = r["sjf+easy"]["avg_jct_h"], r["learned+easy"]["avg_jct_h"]
            print(f"{name}: sjf+easy {s:.2f} h, learned+easy {l:.2f} h ({l / s:.3f}x)")


if __name__ == "__main__":
    main()
