#!/usr/bin/env python3
"""A sliding window longer than the sequence costs no memory (docs/reliability.md).

    window_memory_test.py XGRAD WORKDIR [--cap-mib 3072] [--slack-mib 24]

A window W at least as long as the sequence is plain causal attention, so nothing may grow
with W beyond the context. For each command (train on sort and on reverse, which evaluate
on 500 held-out problems with KV caches, then generate and convert of the checkpoint whose
window is 65536) the peak resident set with --window 65536 must stay within --slack-mib MiB
and 10% of the same command without a window. Each command runs under an address-space cap
of --cap-mib MiB, so a program that sizes its caches by W fails with "out of memory" here
instead of taking the machine's memory; under AddressSanitizer, which reserves far more
address space than any cap allows, the cap is left out and the RSS comparison alone decides.
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys

ENV = dict(os.environ, OMP_NUM_THREADS="1")
SMALL = ["--batch", "8", "--d-model", "16", "--heads", "2", "--layers", "2", "--threads", "1", "--no-progress",
         "--no-plot"]


def fail(msg):
    sys.exit(f"FAILED: {msg}")


def sanitized(xgrad):
    with open(xgrad, "rb") as f:
        return b"__asan_init" in f.read()


def peak_rss_mib(cmd, cap_mib):
    """Runs cmd; returns (exit status, stderr, peak RSS in MiB) of that process alone."""
    def limit():
        if cap_mib:
            resource.setrlimit(resource.RLIMIT_AS, (cap_mib << 20, cap_mib << 20))
    p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limit)
    err = p.stderr.read().decode("utf-8", "replace")
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, err, usage.ru_maxrss / 1024.0  # ru_maxrss: KiB on Linux


def compare(name, with_window, without, cap, slack):
    code, err, rss = peak_rss_mib(with_window, cap)
    if code != 0:
        fail(f"{name} with --window 65536: exit {code}: {err.strip()}")
    code, err, ref = peak_rss_mib(without, cap)
    if code != 0:
        fail(f"{name} without a window: exit {code}: {err.strip()}")
    bound = ref * 1.1 + slack
    print(f"{name}: peak RSS {rss:.1f} MiB with --window 65536, {ref:.1f} MiB without (bound {bound:.1f})", flush=True)
    if rss > bound:
        fail(f"{name}: {rss:.1f} MiB with --window 65536 > {bound:.1f} MiB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("xgrad")
    ap.add_argument("work")
    ap.add_argument("--cap-mib", type=int, default=3072)
    ap.add_argument("--slack-mib", type=float, default=24)
    a = ap.parse_args()
    xgrad, work = os.path.abspath(a.xgrad), os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cap = 0 if sanitized(xgrad) else a.cap_mib
    if not cap:
        print("AddressSanitizer build: no address-space cap, RSS comparison only", flush=True)
    for task in ("sort", "reverse"):
        base = [xgrad, "train", "--task", task, "--steps", "2"] + SMALL
        compare(f"train --task {task}", base + ["--window", "65536", "--out", os.path.join(work, task + "-w")],
                base + ["--out", os.path.join(work, task)], cap, a.slack_mib)
    for task, prompt in (("sort", "95173062|"), ("reverse", "3141")):
        model = os.path.join(work, task + "-w", "model.safetensors")
        ref = os.path.join(work, task, "model.safetensors")
        gen = ["generate", "--prompt", prompt, "--max-new", "8"]
        compare(f"generate ({task})", [xgrad] + gen + ["--checkpoint", model], [xgrad] + gen + ["--checkpoint", ref],
                cap, a.slack_mib)
    conv = [xgrad, "convert", "--kv-heads", "1", "--overwrite"]
    compare("convert (sort)", conv + [os.path.join(work, "sort-w", "model.safetensors"), os.path.join(work, "c-w.st")],
            conv + [os.path.join(work, "sort", "model.safetensors"), os.path.join(work, "c.st")], cap, a.slack_mib)
    print("window memory: every command with --window 65536 within the bound of the same command without a window")


if __name__ == "__main__":
    main()
