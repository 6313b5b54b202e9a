#!/usr/bin/env python3
"""xgrad's Llama decoding beside llama2.c's run.c, side by side in one run (docs/performance.md,
"Generation (Llama) vs llama2.c run.c").

    generate_vs_runc.py RUN_C [--build DIR] [--base-build DIR] [--work DIR] [--rounds N] [--reps N]
                        [--shape S ...] [--threads T ...]

RUN_C is llama2.c's run.c, fetched by you (for instance
`git --git-dir=<llama2.c clone>/.git show HEAD:run.c > /tmp/runc/run.c`); the repository
neither ships nor needs it. If the file is absent the script says so and measures xgrad only.
It builds run.c as llama2.c's Makefile's `runfast`/`runomp` do (`gcc -Ofast -march=native
-fopenmp run.c -lm`) in --work (a temporary folder by default, never the repository), writes
random-weight models of the stories15M and stories42M shapes and a dummy tokenizer.bin there
(bench/llama2c_random.py), then, for --rounds rounds (the order of the two programs flips each
round), for every shape and thread count runs

    build/bin/bench_generate --shape S --threads T --reps R
    OMP_NUM_THREADS=T run S.bin -z tokenizer.bin -n 256 -t 0

and prints each program's decode tokens/s (bench_generate: its median over --reps decodes of
255 tokens from BOS; run.c: its "achieved tok/s" over positions 1..255, greedy), the medians
over rounds and the ratio xgrad / run.c (above 1: xgrad is faster), and both programs' decode
traffic as a share of the read bandwidth bench_generate measures (the bytes a token reads, which
are the same for both, at the median read bandwidth of xgrad's runs). With --base-build DIR a
second bench_generate (DIR/bin/bench_generate: another build, e.g. of the commit before a
change) runs in the same rounds beside the two, and its ratio to run.c is printed too. Python 3
standard library and numpy (for the model files).
"""
import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama2c_random  # noqa: E402


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(cmd, env=None, what=""):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit("generate_vs_runc: %s failed (exit %d): %s\n%s" % (what or cmd[0], p.returncode, " ".join(cmd),
                                                                    p.stderr.strip()))
    return p


def xgrad_decode(bench, shape, threads, reps):
    """(decode tok/s, prefill tok/s, bytes a decoded token reads, read bandwidth GB/s) of one
    bench_generate run; the last two None from a build that prints no read bandwidth."""
    p = run([bench, "--shape", shape, "--threads", str(threads), "--reps", str(reps)], what="bench_generate")
    dec = re.search(r"^decode tokens/s \(median\): ([0-9.]+)$", p.stdout, re.M)
    pre = re.search(r"^prefill tokens/s \(median\): ([0-9.]+)$", p.stdout, re.M)
    if not dec or not pre:
        sys.exit("generate_vs_runc: unexpected bench_generate output:\n" + p.stdout)
    reads = re.search(r"^decode reads [0-9.]+ MB a token \(([0-9]+) bytes\)", p.stdout, re.M)
    bw = re.search(r"^read bandwidth \([^)]*\): ([0-9.]+) GB/s$", p.stdout, re.M)
    return (float(dec.group(1)), float(pre.group(1)), int(reads.group(1)) if reads else None,
            float(bw.group(1)) if bw else None)


def runc_decode(runc, model, tokenizer, threads, steps):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = run([runc, model, "-z", tokenizer, "-n", str(steps), "-t", "0"], env=env, what="run.c")
    m = re.search(r"achieved tok/s: ([0-9.]+)", p.stderr)
    if not m:
        sys.exit("generate_vs_runc: run.c printed no 'achieved tok/s':\n" + p.stderr)
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_c", help="path of llama2.c's run.c (fetched by you; skipped with a message if absent)")
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"),
                    help="xgrad build folder holding bin/bench_generate (default: build)")
    ap.add_argument("--base-build", help="a second xgrad build folder measured in the same rounds (e.g. the commit before)")
    ap.add_argument("--work", help="folder for run.c's binary and the model files (default: a temporary one)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--reps", type=int, default=5, help="bench_generate's --reps (default 5)")
    ap.add_argument("--shape", action="append", choices=sorted(llama2c_random.SHAPES),
                    help="model shape (repeatable; default both)")
    ap.add_argument("--threads", action="append", type=int, help="thread count (repeatable; default 1 and 2)")
    args = ap.parse_args()
    shapes = args.shape or ["stories15M", "stories42M"]
    thread_counts = args.threads or [1, 2]
    if args.rounds < 1 or args.reps < 1 or any(t < 1 for t in thread_counts):
        ap.error("--rounds, --reps and --threads must be at least 1")
    bench = os.path.join(args.build, "bin", "bench_generate")
    if not os.path.isfile(bench):
        sys.exit("generate_vs_runc: %s not found: build the bench_generate target first" % bench)
    base = os.path.join(args.base_build, "bin", "bench_generate") if args.base_build else None
    if base and not os.path.isfile(base):
        sys.exit("generate_vs_runc: %s not found: build the bench_generate target there first" % base)
    have_runc = os.path.isfile(args.run_c)
    if not have_runc:
        print("generate_vs_runc: %s not found: skipping run.c, measuring xgrad only" % args.run_c)

    work = args.work or tempfile.mkdtemp(prefix="xgrad_runc_")
    os.makedirs(work, exist_ok=True)
    runc = os.path.join(work, "run")
    tokenizer = os.path.join(work, "tokenizer.bin")
    if have_runc:
        cc = ["gcc", "-Ofast", "-march=native", "-fopenmp", args.run_c, "-lm", "-o", runc]
        run(cc, what="building run.c")
        print("built run.c: " + " ".join(cc))
        llama2c_random.write_tokenizer(tokenizer)
        for s in shapes:
            llama2c_random.write_model(os.path.join(work, s + ".bin"), s, seed=0)
    steps = 256  # run.c -n: forward passes at positions 0..255; it times 1..255

    print("CPU: %s, %d logical CPUs; load average %.2f at the start; %s" %
          (cpu_name(), os.cpu_count() or 0, os.getloadavg()[0], time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
    print("xgrad: %s --shape S --threads T --reps %d" % (bench, args.reps))
    if base:
        print("base:  %s --shape S --threads T --reps %d" % (base, args.reps))
    if have_runc:
        print("run.c: OMP_NUM_THREADS=T %s S.bin -z %s -n %d -t 0" % (runc, tokenizer, steps))
    results = {}  # (shape, threads) -> {"xgrad": [...], "prefill": [...], "runc": [...]}
    for r in range(args.rounds):
        for s in shapes:
            for t in thread_counts:
                res = results.setdefault((s, t), {"xgrad": [], "prefill": [], "runc": [], "base": [], "bw": []})
                order = ["xgrad", "runc"] if r % 2 == 0 else ["runc", "xgrad"]
                if base:
                    order = ["xgrad", "base", "runc"] if r % 2 == 0 else ["runc", "base", "xgrad"]
                for who in order:
                    if who == "base":
                        res["base"].append(xgrad_decode(base, s, t, args.reps)[0])
                    elif who == "xgrad":
                        dec, pre, nbytes, bw = xgrad_decode(bench, s, t, args.reps)
                        res["xgrad"].append(dec)
                        res["prefill"].append(pre)
                        if nbytes and bw:
                            res["bytes"] = nbytes
                            res["bw"].append(bw)
                    elif have_runc:
                        res["runc"].append(runc_decode(runc, os.path.join(work, s + ".bin"), tokenizer, t, steps))
                print("round %d %s threads %d: xgrad decode %.1f tok/s%s%s" %
                      (r + 1, s, t, res["xgrad"][-1], ", base %.1f tok/s" % res["base"][-1] if base else "",
                       ", run.c %.1f tok/s" % res["runc"][-1] if have_runc else ""), flush=True)

    print()
    print("| shape | threads | xgrad decode tok/s | run.c decode tok/s | ratio xgrad / run.c | xgrad prefill tok/s |")
    print("|---|---|---|---|---|---|")
    for (s, t), res in results.items():
        x = statistics.median(res["xgrad"])
        p = statistics.median(res["prefill"])
        if have_runc:
            c = statistics.median(res["runc"])
            print("| %s | %d | %.1f | %.1f | %.2f | %.0f |" % (s, t, x, c, x / c, p))
            if base:
                xb = statistics.median(res["base"])
                print("| %s (base) | %d | %.1f | %.1f | %.2f | |" % (s, t, xb, c, xb / c))
        else:
            print("| %s | %d | %.1f | not run | n/a | %.0f |" % (s, t, x, p))
            if base:
                print("| %s (base) | %d | %.1f | not run | n/a | |" % (s, t, statistics.median(res["base"])))
    if any(res["bw"] for res in results.values()):
        # Both programs read the same weights and KV cache a token (bench_generate counts the bytes).
        print()
        print("against the read bandwidth bench_generate measures in each run (a buffer of the bytes a token reads):")
        print("| shape | threads | bytes a token | read bandwidth GB/s (median) | xgrad | run.c |")
        print("|---|---|---|---|---|---|")
        for (s, t), res in results.items():
            if not res["bw"]:
                continue
            bw = statistics.median(res["bw"])
            share = lambda tps: "%.1f%%" % (100.0 * tps * res["bytes"] / (bw * 1e9))  # noqa: E731
            print("| %s | %d | %d | %.1f | %s | %s |" % (s, t, res["bytes"], bw, share(statistics.median(res["xgrad"])),
                                                     share(statistics.median(res["runc"])) if have_runc else "not run"))
    print()
    print("per round (decode tok/s):")
    for (s, t), res in results.items():
        print("  %s threads %d: xgrad %s%s%s" % (s, t, res["xgrad"], "; base %s" % res["base"] if base else "",
                                                 "; run.c %s" % res["runc"] if have_runc else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
