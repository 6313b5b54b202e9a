#!/usr/bin/env python3
"""The text task on a 10 MB and a 100 MB corpus: tokenising time and training peak memory.

usage: text_corpus.py XGRAD WORKDIR [--tokenizer tok.model|bytes] [--sizes 10,100] [--steps N]

The corpora are made from text every Debian machine has: the package copyright files under
/usr/share/doc (about 20 MB) and the licence texts of /usr/share/common-licenses, copied as
many times as needed (each copy its own file, so its own document). For each size it runs
`xgrad train --task text` (a ~1M-parameter model, a few steps) under /usr/bin/time and
prints the corpus size, the tokens, the time to tokenise it (the run's `corpus:` line), the
rate, and the training process's peak RSS; then the ratio of the peak RSS of the largest
corpus to the smallest (the target: within 10% of 1).
"""
import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("xgrad")
ap.add_argument("work")
ap.add_argument("--tokenizer", default="bytes")
ap.add_argument("--sizes", default="10,100")
ap.add_argument("--steps", type=int, default=20)
a = ap.parse_args()
work = Path(a.work)
work.mkdir(parents=True, exist_ok=True)

sources = sorted(p for p in Path("/usr/share/doc").glob("*/copyright") if p.is_file())
licences = sorted(p for p in Path("/usr/share/common-licenses").iterdir() if p.is_file())


def make_corpus(folder, megabytes):
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "doc").mkdir(parents=True)
    target, total = megabytes * 1000 * 1000, 0
    for p in sources:
        if total >= target:
            return total
        data = p.read_bytes()
        (folder / "doc" / (p.parent.name + ".txt")).write_bytes(data)
        total += len(data)
    copy = 0
    while total < target:
        d = folder / "licences" / f"copy{copy:05d}"
        d.mkdir(parents=True)
        for p in licences:
            data = p.read_bytes()
            (d / p.name).write_bytes(data)
            total += len(data)
        copy += 1
    return total


results = []
for size in [int(s) for s in a.sizes.split(",")]:
    folder = work / f"corpus{size}"
    total = make_corpus(folder, size)
    out = work / f"run{size}"
    cmd = ["/usr/bin/time", "-f", "peak_rss_kb %M", a.xgrad, "train", "--task", "text", "--text", str(folder),
           "--tokenizer", a.tokenizer, "--out", str(out), "--overwrite", "--steps", str(a.steps), "--eval-every",
           str(a.steps), "--d-model", "128", "--layers", "4", "--heads", "4", "--context", "128", "--batch", "16",
           "--threads", "2", "--no-progress", "--no-plot"]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        sys.exit(f"text_corpus: {size} MB run failed: {r.stderr.strip()}")
    corpus_line = next(l for l in r.stdout.splitlines() if l.startswith("corpus:"))
    seconds = float(re.search(r"tokenised in ([0-9.]+) s", corpus_line).group(1))
    tokens = sum(int(x) for x in re.findall(r"(?:training|validation) ([0-9]+) tokens", corpus_line))
    rss = int(re.search(r"peak_rss_kb ([0-9]+)", r.stderr).group(1))
    results.append((size, total, tokens, seconds, rss))
    print(f"corpus {total / 1e6:7.1f} MB: {tokens} tokens, tokenised in {seconds:6.2f} s "
          f"({total / 1e6 / max(seconds, 1e-9):6.2f} MB/s); training peak RSS {rss / 1024:7.1f} MiB", flush=True)

if len(results) > 1:
    small, large = results[0], results[-1]
    print(f"peak RSS {large[1] / 1e6:.0f} MB / {small[1] / 1e6:.0f} MB corpus: {large[4] / small[4]:.3f} "
          f"(target: within 10% of 1)")
    print(f"tokenising 100 MB extrapolated from the largest corpus: {large[3] * 1e8 / large[1]:.1f} s (target < 60 s)")
