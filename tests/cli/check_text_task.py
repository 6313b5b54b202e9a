#!/usr/bin/env python3
"""xgrad train --task text, xgrad eval and the tokenizer a checkpoint carries, end to end.

usage: check_text_task.py XGRAD WORKDIR

- A SentencePiece tokenizer (when xgrad has SentencePiece; bytes otherwise) and a small text
  run; `xgrad eval --split val` gives the run's own last validation numbers (val_loss and
  val_bpb of log.csv), computed independently by the same windows.
- generate encodes a prompt with the checkpoint's tokenizer and decodes the continuation.
- eval refuses another tokenizer, naming both; resume refuses a changed tokenizer file.
"""
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

XGRAD, WORK = sys.argv[1], Path(sys.argv[2])
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(*args):
    return subprocess.run([XGRAD, *args], cwd=WORK, capture_output=True, text=True, errors="replace", timeout=600)


if WORK.exists():
    shutil.rmtree(WORK)
(WORK / "corpus" / "sub").mkdir(parents=True)
words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
for i, w in enumerate(words):
    folder = WORK / "corpus" / ("sub" if i % 3 == 0 else "")
    text = "".join(f"The {w} line {k} says {words[(i + k) % len(words)]} and café {k % 7}.\n" for k in range(60))
    (folder / f"{w}.txt").write_text(text)

has_sp = run("tokenizer", "train", "--help").returncode == 0 and \
    run("tokenizer", "train", "--vocab-size", "300", "--model-type", "bpe", "--out", "tok.model", "corpus").returncode == 0
tokenizer = "tok.model" if has_sp else "bytes"
print(f"tokenizer: {tokenizer}")

small = ["--steps", "10", "--eval-every", "5", "--batch", "8", "--context", "16", "--d-model", "16", "--heads", "2",
         "--layers", "1", "--no-progress", "--no-plot", "--threads", "1"]
r = run("train", "--task", "text", "--text", "corpus", "--tokenizer", tokenizer, "--out", "run", *small)
check(r.returncode == 0, f"text run trains ({r.stderr.strip()})")
check("RESULT val_bits_per_byte" in r.stdout, "text run prints RESULT val_bits_per_byte")
rows = (WORK / "run" / "log.csv").read_text().splitlines()
check(rows[0] == "step,lr,loss,grad_norm,tokens_per_s,elapsed_s,val_loss,val_bpb", "log.csv has the val_bpb column")
last = rows[-1].split(",")
val_loss, val_bpb = float(last[6]), float(last[7])

e = run("eval", "--checkpoint", "run/model.safetensors", "--text", "corpus", "--split", "val", "--json", "-")
check(e.returncode == 0, f"eval runs ({e.stderr.strip()})")
if e.returncode == 0:
    j = json.loads(e.stdout)
    check(j.get("command") == "eval" and j.get("xgrad_version"), "eval --json names its command and xgrad's version")
    check(abs(j["nats_per_token"] - val_loss) <= 1e-5 * val_loss,
          f"eval --split val nats/token {j['nats_per_token']} = the run's last val_loss {val_loss}")
    check(abs(j["bits_per_byte"] - val_bpb) <= 1e-5 * val_bpb,
          f"eval --split val bits/byte {j['bits_per_byte']} = the run's last val_bpb {val_bpb}")
    check(abs(j["bits_per_byte"] - j["nats_per_token"] * j["measured_tokens"] / j["measured_bytes"] / math.log(2))
          <= 1e-9 * j["bits_per_byte"], "eval: bits per byte = nats x tokens / bytes / ln 2")
    check(abs(j["perplexity"] - math.exp(j["nats_per_token"])) <= 1e-9 * j["perplexity"], "eval: perplexity = e^nats")
    whole = run("eval", "--checkpoint", "run/model.safetensors", "--text", "corpus", "--json", "-")
    total = sum(p.stat().st_size for p in (WORK / "corpus").rglob("*.txt"))
    check(whole.returncode == 0 and json.loads(whole.stdout)["bytes"] == total, "eval --split all counts every byte")

g = run("generate", "--checkpoint", "run/model.safetensors", "--prompt", "The alpha line", "--max-new", "5",
        "--json", "-")
check(g.returncode == 0, f"generate with the checkpoint's tokenizer ({g.stderr.strip()})")
if g.returncode == 0:
    gj = json.loads(g.stdout)
    check(gj["prompt"]["text"] == "The alpha line", "generate: the prompt decodes back to itself")

if has_sp:
    bad = run("eval", "--checkpoint", "run/model.safetensors", "--text", "corpus", "--tokenizer", "bytes")
    check(bad.returncode == 2 and "differs" in bad.stderr and "bytes" in bad.stderr,
          f"eval refuses another tokenizer naming both ({bad.stderr.strip()})")
    r2 = run("tokenizer", "train", "--vocab-size", "320", "--model-type", "bpe", "--out", "tok.model", "--overwrite",
             "corpus")
    check(r2.returncode == 0, f"a second tokenizer replaces tok.model ({r2.stderr.strip()})")
    (WORK / "run" / "log.csv").write_text("\n".join(rows[:6]) + "\n")  # as if stopped at step 5
    res = run("train", "--resume", "run", "--no-progress", "--no-plot")
    check(res.returncode == 1 and "tokenizer" in res.stderr and "differs" in res.stderr,
          f"resume refuses a changed tokenizer ({res.stderr.strip()})")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("text task checks passed")
