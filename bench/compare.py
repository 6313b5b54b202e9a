#!/usr/bin/env python3
"""Runs xgrad's benchmarks and the libtorch reference alternately and writes the ratio table.

Issue 8: for every measure, xgrad (build/bin/bench_*) and the libtorch reference
(build-torch/bin/torch_bench_*, XGRAD_BUILD_TORCH_REFERENCE=ON) run one after the other,
round after round (the order flips each round), libtorch at its best settings
(--blas-threads 1 for training steps, Debian's jemalloc preloaded for attention). Each
program prints a median over its reps; the table takes the median over rounds. The table,
the exact commands, the date and the CPU go to docs/performance.md between the markers
<!-- compare.py begin --> and <!-- compare.py end --> (only that block is replaced, the prose
around it is kept). --only re-runs some rows and keeps the others from the previous run.

Usage: bench/compare.py [--rounds 3] [--build build] [--torch-build build-torch]
                        [--quick] [--only ROW ...] [--output docs/performance.md]
Python 3 standard library only.
"""
import argparse
import datetime
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
BEGIN, END = "<!-- compare.py begin -->", "<!-- compare.py end -->"
DATA_PREFIX = "<!-- compare.py data: "
# The fused path at T 16384 runs under this address-space limit, so that a fallback to the
# composed path (which needs tens of GiB there) fails cleanly instead of exhausting the
# machine's memory.
FUSED_LONG_LIMIT_GIB = 4

M_ARGS = ["--d", "256", "--heads", "8", "--layers", "4", "--seq", "256", "--batch", "8", "--steps", "20",
          "--warmup", "3"]
QUICK_TRAIN = ["--d", "32", "--heads", "4", "--layers", "1", "--seq", "16", "--batch", "2", "--steps", "3",
               "--warmup", "1"]


class Variant:
    """One program with its arguments; `lib` is 'xgrad' or 'torch'."""

    def __init__(self, name, lib, program, args, preload=False, limit_gib=None):
        self.name, self.lib, self.program, self.args = name, lib, program, args
        self.preload, self.limit_gib = preload, limit_gib

    def command(self, dirs):
        """The command as a shell line, paths relative to the repository."""
        exe = os.path.join(dirs[self.lib], "bin", self.program)
        words = [os.path.relpath(exe, REPO)] + self.args
        prefix = f"LD_PRELOAD={JEMALLOC} " if self.preload else ""
        limit = f"(ulimit -v {self.limit_gib * 1024 * 1024}; " if self.limit_gib else ""
        return limit + prefix + " ".join(shlex.quote(w) for w in words) + (")" if limit else "")


def train(args, gqa=False):
    kv = ["--kv-heads", "2"] if gqa else []
    return [Variant("xgrad", "xgrad", "bench_train_step", args + kv),
            Variant("libtorch", "torch", "torch_bench_train_step", args + kv + ["--blas-threads", "1"])]


def attention(seq_args):
    return [Variant("xgrad", "xgrad", "bench_attention", seq_args),
            Variant("libtorch composed", "torch", "torch_bench_attention", seq_args + ["--impl", "composed"],
                    preload=True),
            Variant("libtorch _scaled_dot_product_attention", "torch", "torch_bench_attention",
                    seq_args + ["--impl", "fused"], preload=True)]


def rows(quick):
    """(key, measure, target text, variants, kind); kind says how the row is judged."""
    q = quick
    s_args = QUICK_TRAIN if q else []
    m_args = QUICK_TRAIN if q else M_ARGS
    t1, t2 = ("64", "128") if q else ("1024", "2048")
    t4, t16 = ("256", "1024") if q else ("4096", "16384")
    mem_reps = ["--reps", "2", "--warmup", "0"] if q else ["--reps", "3", "--warmup", "1"]
    return [
        ("train_S", "train step S (vocab 65, d 64, 4 heads, 2 layers, T 64, batch 16)", "<= 0.6",
         train(s_args), "time"),
        ("train_M", "train step M (d 256, 8 heads, 4 layers, T 256, batch 8)", "<= 0.6",
         train(m_args + ["--kv-heads", m_args[m_args.index("--heads") + 1]]), "time"),
        ("train_M_gqa", "train step M with 2 kv heads (GQA)", "<= 0.6", train(m_args, gqa=True), "time"),
        ("attn_T1024", f"causal attention fwd+bwd, B 1, H 8, d_h 64, T {t1}", "<= 0.5",
         attention(["--seq", t1]), "time"),
        ("attn_T2048", f"same, T {t2}", "<= 0.5", attention(["--seq", t2]), "time"),
        ("attn_fused_mem_T4096", f"attention fused path, T {t4}: RSS growth over the inputs", "<= 1/8 of composed",
         [Variant("xgrad fused", "xgrad", "bench_attention", ["--seq", t4, "--impl", "fused"] + mem_reps),
          Variant("xgrad composed", "xgrad", "bench_attention", ["--seq", t4, "--impl", "composed"] + mem_reps),
          Variant("libtorch composed", "torch", "torch_bench_attention",
                  ["--seq", t4, "--impl", "composed"] + mem_reps, preload=True)], "memory"),
        ("attn_fused_T16384", f"attention fused path runs at T {t16}", "runs (composed cannot)",
         [Variant("xgrad fused", "xgrad", "bench_attention",
                  ["--seq", t16, "--impl", "fused", "--reps", "1", "--warmup", "0"],
                  limit_gib=FUSED_LONG_LIMIT_GIB)], "runs"),
        ("op_overhead", "op overhead, 1-element chain, fwd+bwd per op", "<= 0.5 us",
         [Variant("xgrad", "xgrad", "bench_op_overhead", ["--k", "100", "--reps", "5"] if q else []),
          Variant("libtorch", "torch", "torch_bench_op_overhead", ["--k", "100", "--reps", "5"] if q else [])],
         "overhead"),
        ("matmul_n1024", f"matmul n {128 if q else 1024} (ratio: xgrad / raw OpenBLAS sgemm)", ">= 0.95",
         [Variant("xgrad", "xgrad", "bench_matmul", ["--n", "128" if q else "1024"]),
          Variant("libtorch", "torch", "torch_bench_matmul", ["--n", "128" if q else "1024"])], "matmul"),
    ]


def fail(msg):
    print(f"compare.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def run_variant(v, dirs):
    """Runs one program; returns its parsed figures or {'error': one line}."""
    exe = os.path.join(dirs[v.lib], "bin", v.program)
    env = dict(os.environ)
    if v.preload:
        env["LD_PRELOAD"] = JEMALLOC

    def limit():
        if v.limit_gib:
            n = v.limit_gib << 30
            resource.setrlimit(resource.RLIMIT_AS, (n, n))

    try:
        p = subprocess.run([exe] + v.args, env=env, capture_output=True, text=True, timeout=3600,
                           preexec_fn=limit)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 3600 s"}
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        err = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        return {"error": err[:300]}
    m = re.fullmatch(r"RESULT (\S+) (\S+) (\S+)", lines[-1])
    if not m:
        return {"error": f"no RESULT line at the end (last line: {lines[-1][:100]})"}
    out = {"value": float(m.group(2)), "unit": m.group(3)}
    for key, pattern in (("rss_growth", r"RSS growth over inputs: ([0-9.]+) MiB"),
                         ("raw_gflops", r"raw sgemm GFLOPS: ([0-9.]+)"),
                         ("peak_rss", r"peak RSS: ([0-9.]+) MiB")):
        found = re.search(f"^{pattern}$", p.stdout, re.M)
        if found:
            out[key] = float(found.group(1))
    return out


def median_of(runs, key):
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values and len(values) == len(runs) else None


def errors_of(runs):
    return sorted({r["error"] for r in runs if "error" in r})


def fmt(v, unit=""):
    if v is None:
        return "n/a"
    text = f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return f"{text} {unit}".strip()


def judge(kind, target, by_name):
    """(libtorch cell, xgrad cell, ratio cell, met cell) from the runs of each variant."""
    def med(name, key="value"):
        return median_of(by_name[name], key) if name in by_name else None

    def failed(name):
        e = errors_of(by_name.get(name, []))
        return f"failed: {e[0]}" if e else None

    torch_names = [n for n in by_name if n.startswith("libtorch")]
    if kind in ("time", "overhead"):
        unit = "us" if kind == "overhead" else "ms"
        per = {n: med(n) for n in torch_names}
        ok = {n: v for n, v in per.items() if v is not None}
        best = min(ok, key=ok.get) if ok else None
        torch_cell = fmt(ok[best], unit) + (f" ({best[len('libtorch '):]})" if best and best != "libtorch" else "") \
            if best else (failed(torch_names[0]) if torch_names else "n/a")
        x = med("xgrad")
        if x is None:
            return torch_cell, failed("xgrad") or "n/a", "n/a", "no"
        ratio = x / ok[best] if best else None
        if kind == "overhead":
            met = x <= 0.5
        else:
            met = ratio is not None and ratio <= float(target.split()[-1])
        return torch_cell, fmt(x, unit), fmt(ratio), "yes" if met else "no"
    if kind == "matmul":
        t, x, raw = med("libtorch"), med("xgrad"), med("xgrad", "raw_gflops")
        ratio = x / raw if x is not None and raw else None
        return (fmt(t, "GFLOPS") if t is not None else failed("libtorch"),
                fmt(x, "GFLOPS") + (f" (raw sgemm {fmt(raw, 'GFLOPS')})" if raw else "") if x is not None
                else failed("xgrad"), fmt(ratio), "yes" if ratio is not None and ratio >= 0.95 else "no")
    if kind == "memory":
        t = med("libtorch composed", "rss_growth")
        fu, co = med("xgrad fused", "rss_growth"), med("xgrad composed", "rss_growth")
        ratio = fu / co if fu is not None and co else None
        xcell = (f"fused {fmt(fu, 'MiB')}" if fu is not None else f"fused {failed('xgrad fused')}") + \
            (f", composed {fmt(co, 'MiB')}" if co is not None else f", composed {failed('xgrad composed')}")
        return (f"composed {fmt(t, 'MiB')}" if t is not None else failed("libtorch composed"), xcell,
                fmt(ratio) + " (fused / composed)" if ratio is not None else "n/a",
                "yes" if ratio is not None and ratio <= 1 / 8 else "no")
    # kind == "runs"
    runs = by_name["xgrad fused"]
    if errors_of(runs):
        return "not run", failed("xgrad fused"), "n/a", "no"
    return ("not run (composed: one [1, 8, T, T] float32 scores array is 8 GiB at T 16384)",
            f"{fmt(med('xgrad fused'), 'ms')}, RSS growth {fmt(med('xgrad fused', 'rss_growth'), 'MiB')}",
            "n/a", "yes")


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        return m.group(1).strip() if m else "unknown"
    except OSError:
        return "unknown"


def read_block(path):
    """(text before, previous rows by key, text after) of the output file."""
    if not os.path.exists(path):
        return None, {}, None
    text = open(path, encoding="utf-8").read()
    if BEGIN not in text or END not in text:
        fail(f"{path} exists but has no {BEGIN} ... {END} block to replace")
    before, rest = text.split(BEGIN, 1)
    block, after = rest.split(END, 1)
    previous = {}
    m = re.search(re.escape(DATA_PREFIX) + r"(.*?) -->", block, re.S)
    if m:
        previous = {r["key"]: r for r in json.loads(m.group(1))}
    return before, previous, after


def render(results, header):
    lines = [BEGIN, "", *header, "",
             "| measure | libtorch best | xgrad | ratio | target | met? |", "|---|---|---|---|---|---|"]
    for r in results:
        note = "" if r["run"] == header_run_id(header) else f" (run of {r['run']})"
        lines.append(f"| {r['measure']}{note} | {r['torch']} | {r['xgrad']} | {r['ratio']} | {r['target']} | "
                     f"{r['met']} |")
    lines += ["", "Commands (each run once per round, xgrad and libtorch alternating; the table holds the medians "
              "over rounds of each program's median over its reps):", "", "```"]
    for r in results:
        lines.append(f"# {r['key']}")
        lines += r["commands"]
    lines += ["```", "", "Per-round values (RESULT lines):", ""]
    for r in results:
        for name, values in r["rounds"].items():
            lines.append(f"- {r['key']}, {name}: {values}")
    data = json.dumps(results, separators=(",", ":")).replace("-->", "--\\u003e")
    lines += ["", f"{DATA_PREFIX}{data} -->", "", END]
    return "\n".join(lines)


def header_run_id(header):
    return header[0].split("Run of ", 1)[1].split(" ", 1)[0] if header and "Run of " in header[0] else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per measure (>= 3 for the table)")
    ap.add_argument("--build", default="build", help="xgrad build directory (bench programs in <dir>/bin)")
    ap.add_argument("--torch-build", default="build-torch", help="libtorch reference build directory")
    ap.add_argument("--quick", action="store_true", help="small sizes, to test this script (not the measures)")
    ap.add_argument("--only", action="append", metavar="ROW", help="run only this row (repeatable): " +
                    ", ".join(k for k, *_ in rows(False)))
    ap.add_argument("--output", default=os.path.join(REPO, "docs", "performance.md"), help="file to update")
    a = ap.parse_args()
    if a.rounds < 1:
        fail(f"--rounds must be >= 1, got {a.rounds}")
    all_rows = rows(a.quick)
    keys = [k for k, *_ in all_rows]
    for k in a.only or []:
        if k not in keys:
            fail(f"--only: unknown row '{k}' (rows: {', '.join(keys)})")
    selected = [r for r in all_rows if not a.only or r[0] in a.only]
    dirs = {"xgrad": os.path.join(REPO, a.build) if not os.path.isabs(a.build) else a.build,
            "torch": os.path.join(REPO, a.torch_build) if not os.path.isabs(a.torch_build) else a.torch_build}
    for _, _, _, variants, _ in selected:
        for v in variants:
            exe = os.path.join(dirs[v.lib], "bin", v.program)
            if not os.access(exe, os.X_OK):
                hint = ("configure with -DXGRAD_BUILD_TORCH_REFERENCE=ON (docs/performance.md)" if v.lib == "torch"
                        else "build the bench targets")
                fail(f"{exe} not found: {hint}")
            if v.preload and not os.path.exists(JEMALLOC):
                fail(f"{JEMALLOC} not found: apt-get install libjemalloc2")
    before, previous, after = read_block(a.output)
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"compare.py: warning: load average {load:.2f}: other processes are running, the figures will be "
              "noisy (run on a quiet machine)", file=sys.stderr)

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    runs = {k: {v.name: [] for v in variants} for k, _, _, variants, _ in selected}
    for rnd in range(a.rounds):
        for key, measure, _, variants, _ in selected:
            # Alternate: the libraries take turns going first.
            order = sorted(variants, key=lambda v: (v.lib == "xgrad") == (rnd % 2 == 0))
            for v in order:
                res = run_variant(v, dirs)
                runs[key][v.name].append(res)
                shown = res.get("error") or f"{res['value']} {res['unit']}" + (
                    f", RSS growth {res['rss_growth']} MiB" if "rss_growth" in res else "")
                print(f"round {rnd + 1}/{a.rounds}  {key:22s} {v.name:40s} {shown}", flush=True)

    results = []
    for key, measure, target, variants, kind in all_rows:
        if a.quick:
            measure = f"[quick sizes, see the commands] {measure}"
        if key not in runs:
            if key in previous and not a.quick and not previous[key].get("quick"):
                results.append(previous[key])
            continue
        tcell, xcell, ratio, met = judge(kind, target, runs[key])
        results.append({"key": key, "measure": measure, "torch": tcell, "xgrad": xcell, "ratio": ratio,
                        "target": target, "met": met, "run": stamp, "quick": a.quick,
                        "commands": [v.command(dirs) for v in variants],
                        "rounds": {n: [r.get("value", r.get("error")) for r in rs] for n, rs in runs[key].items()}})
    only = "".join(f" --only {k}" for k in a.only or [])
    header = [f"Run of {stamp} by `bench/compare.py{' --quick' if a.quick else ''} --rounds {a.rounds}{only}`; "
              f"CPU: {cpu_model()}, "
              f"{os.cpu_count()} logical CPUs, load average {load:.2f} at the start; "
              f"libtorch: Debian libtorch-dev 1.13 (OpenBLAS); "
              f"xgrad commit {git_commit()}."]
    if a.rounds < 3:
        header += ["", f"**{a.rounds} round(s) only: the issue's protocol asks for at least 3.**"]
    if a.quick:
        header.append("")
        header.append("**Quick run (--quick): small sizes to test the script; these are not the issue's measures.**")
    block = render(results, header)
    if before is None:
        before, after = "# Performance\n\n", "\n"
    with open(a.output, "w", encoding="utf-8") as f:
        f.write(before + block + after)
    print(f"wrote {os.path.relpath(a.output)}")
    for r in results:
        print(f"{r['key']:22s} libtorch {r['torch']} | xgrad {r['xgrad']} | ratio {r['ratio']} | target {r['target']}"
              f" | met {r['met']}")


def git_commit():
    p = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (p.stdout.strip() or "unknown") + (" (with uncommitted changes)" if dirty else "")


if __name__ == "__main__":
    main()
