#!/usr/bin/env python3
"""LoRA against a full fine-tune: trainable share, peak RSS and step time at the same batch.

usage: lora_finetune.py XGRAD WORKDIR [--batch 8,1] [--context 256] [--steps 12] [--reps 3]

A model of stories15M's shape (Llama, d_model 288, 6 layers, 6 heads, d_ff 768) with a
1024-piece SentencePiece BPE tokenizer trained on /usr/share/common-licenses (`xgrad tokenizer
train`), saved after one step; then, for each batch, fine-tuned from it (`--init-from`) on the
same texts with and without `--lora-rank 8 --lora-targets all`, `--reps` times interleaved,
each run under /usr/bin/time -v. Prints per run the peak RSS and the mean and fastest step
time over steps 3.. (log.csv's elapsed_s), then per batch the ratios LoRA / full of the
smallest peak RSS and of the mean step time over the repetitions, and the trainable share
the run's description line states. Issue 32's targets: under 2% trainable, RSS at most 0.6x,
step time at most 0.7x.
"""
import argparse
import csv
import re
import subprocess
import sys
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("xgrad")
ap.add_argument("work")
ap.add_argument("--batch", default="8,1")
ap.add_argument("--context", type=int, default=256)
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--reps", type=int, default=3)
a = ap.parse_args()
work = Path(a.work)
work.mkdir(parents=True, exist_ok=True)
texts = "/usr/share/common-licenses"


def run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"lora_finetune: {' '.join(args)} failed ({r.returncode}): {r.stderr[-400:]}")
    return r


tok = work / "lic.model"
if not tok.exists():
    run([a.xgrad, "tokenizer", "train", "--vocab-size", "1024", "--model-type", "bpe", "--out", str(tok), texts])
base = work / "base"
if not (base / "model.safetensors").exists():
    run([a.xgrad, "train", "--task", "text", "--text", texts, "--tokenizer", str(tok), "--arch", "llama",
         "--d-model", "288", "--layers", "6", "--heads", "6", "--d-ff", "768", "--context", str(a.context),
         "--steps", "1", "--batch", "1", "--out", str(base), "--no-progress", "--no-plot", "--overwrite"])

for batch in [int(b) for b in a.batch.split(",")]:
    rss = {"full": [], "lora": []}
    step = {"full": [], "lora": []}
    share = ""
    for rep in range(a.reps):
        for mode in ("full", "lora"):
            out = work / f"run-{mode}"
            args = ["/usr/bin/time", "-v", a.xgrad, "train", "--init-from", str(base / "model.safetensors"),
                    "--task", "text", "--text", texts, "--tokenizer", str(tok), "--context", str(a.context),
                    "--batch", str(batch), "--steps", str(a.steps), "--eval-every", "0", "--checkpoint-every", "0",
                    "--no-progress", "--no-plot", "--overwrite", "--out", str(out)]
            if mode == "lora":
                args += ["--lora-rank", "8", "--lora-targets", "all"]
            r = run(args)
            kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
            e = [float(row["elapsed_s"]) for row in csv.DictReader(open(out / "log.csv"))]
            d = [y - x for x, y in zip(e[1:], e[2:])]
            rss[mode].append(kb)
            step[mode].append(sum(d) / len(d))
            m = re.search(r"(\d+ of \d+ parameters trainable \([0-9.]+%\))", r.stdout)
            if m:
                share = m.group(1)
            print(f"batch {batch} rep {rep + 1} {mode:4s}: peak RSS {kb / 1024:7.1f} MiB, step {sum(d) / len(d):.4f} s "
                  f"mean, {min(d):.4f} s fastest", flush=True)
    mean = lambda v: sum(v) / len(v)
    print(f"batch {batch}: LoRA rank 8 on all projections: {share}; peak RSS {min(rss['lora']) / min(rss['full']):.2f}x, "
          f"step time {mean(step['lora']) / mean(step['full']):.2f}x of the full fine-tune", flush=True)
