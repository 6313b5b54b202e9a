#!/usr/bin/env python3
"""Data-parallel scaling on this machine (docs/distributed.md): bench_dp_step for the small
and the larger model as 1 rank x 1 thread, 1 rank x 2 threads, 2 ranks x 1 thread and
2 ranks x 1 thread with the all-reduce overlapped with backward. Each configuration runs
--rounds times (interleaved, so that a burst of load on a shared machine hits all of them);
the table shows medians over the rounds of each run's median step, its all-reduce time,
tokens/s of the whole job, and the 1-minute load average around each run (the larger of the
values before and after it).

    bench/dp_scaling.py [--build build] [--rounds 3] [--mpiexec mpiexec]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

MODELS = {
    # The default sort job's shapes: GPT d 64, 4 heads, 2 layers, T 16, global batch 64.
    "small": ["--vocab", "11", "--d", "64", "--heads", "4", "--layers", "2", "--seq", "16", "--batch", "64",
              "--steps", "60", "--warmup", "10"],
    # A larger GPT: d 256, 8 heads, 4 layers, T 128, global batch 16 (3.2 M parameters).
    "larger": ["--vocab", "65", "--d", "256", "--heads", "8", "--layers", "4", "--seq", "128", "--batch", "16",
               "--steps", "12", "--warmup", "3"],
}
CONFIGS = [("1 rank x 1 thread", 1, 1, []), ("1 rank x 2 threads", 1, 2, []), ("2 ranks x 1 thread", 2, 1, []),
           ("2 ranks x 1 thread, overlap", 2, 1, ["--overlap", "--bucket-kib", "64"])]
ENV = dict(os.environ, OMPI_MCA_btl="self,vader", OMPI_MCA_pml="ob1", OMPI_MCA_plm="isolated",
           OMPI_MCA_btl_vader_single_copy_mechanism="none")


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run(a, model, ranks, threads, extra):
    prog = os.path.join(a.build, "bin", "bench_dp_step")
    cmd = [prog] + MODELS[model] + ["--threads", str(threads)] + extra
    if ranks > 1:
        cmd = [a.mpiexec, "-np", str(ranks), "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else []) + cmd
    before = load()
    out = subprocess.run(cmd, env=ENV, capture_output=True, text=True, check=True).stdout
    step = float(re.search(r"RESULT dp_step_ms ([0-9.]+)", out).group(1))
    ar = float(re.search(r"all-reduce per step: min [0-9.]+, median ([0-9.]+)", out).group(1))
    tps = float(re.search(r"tokens/s \(whole job\): ([0-9.]+)", out).group(1))
    params = re.search(r"parameters: ([0-9]+)", out).group(1)
    return step, ar, tps, params, max(before, load())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mpiexec", default="mpiexec")
    a = ap.parse_args()
    results = {}
    loads = []
    for r in range(a.rounds):
        loads.append(load())
        for model in MODELS:
            for name, ranks, threads, extra in CONFIGS:
                results.setdefault((model, name), []).append(run(a, model, ranks, threads, extra))
        print(f"round {r + 1}/{a.rounds} done (load before it {loads[-1]:.2f})", file=sys.stderr, flush=True)
    print(f"load average (1 min) before each round: {', '.join(f'{x:.2f}' for x in loads)}")
    print("| model | configuration | step ms | all-reduce ms/step | tokens/s | vs 1 rank x 2 threads | load during runs |")
    print("|---|---|---|---|---|---|---|")
    for model in MODELS:
        base = statistics.median(x[2] for x in results[(model, "1 rank x 2 threads")])
        for name, _, _, _ in CONFIGS:
            rs = results[(model, name)]
            step = statistics.median(x[0] for x in rs)
            ar = statistics.median(x[1] for x in rs)
            tps = statistics.median(x[2] for x in rs)
            loads_seen = ", ".join(f"{x[4]:.1f}" for x in rs)
            print(f"| {model} ({rs[0][3]} parameters) | {name} | {step:.2f} | {ar:.2f} | {tps:.0f} | {tps / base:.2f} "
                  f"| {loads_seen} |")


if __name__ == "__main__":
    main()
