#!/usr/bin/env python3
"""Fine-tuning what xgrad imports or wrote (issue 32, part 2): `xgrad train --init-from M --task
text --text FILES --tokenizer T` on the checkpoints of tests/fixtures/checkpoints.

usage: check_fine_tune.py XGRAD WORKDIR

- An imported llama2.c model (llama2c.safetensors, vocabulary 300, context 32) fine-tuned with
  its tokenizer.bin (300 pieces) and a training window of 16: the weights change, the saved
  model is a text model carrying the tokenizer with the model's context (32) and vocabulary;
  stopped and resumed it stays that model; generate's ids decode (tokenizer decode) to its text;
  export llama2c writes run.c's header for those sizes and `import llama2c` of it gives back the
  same weights, bit for bit.
- The same model with a SentencePiece model of 280 pieces (fewer than the model's 300): ids 280..299
  are placeholders "<280>".."<299>" in the saved vocabulary and never sampled (temperature 1,
  several seeds); eval and export work.
- A model made in PyTorch with tools/xgrad_torch.py (task "custom") fine-tuned with the
  tokenizer.bin (when torch is importable).
- A SentencePiece text run (text_sp.safetensors) fine-tuned with its own tokenizer; without
  --tokenizer it is refused (it would otherwise train with bytes).
"""
import json
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures", "checkpoints")
XGRAD, WORK = sys.argv[1], sys.argv[2]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(*args):
    return subprocess.run([XGRAD, *args], cwd=WORK, capture_output=True, errors="replace", text=True, timeout=600)


def header(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    return h.pop("__metadata__", {}), h, raw[8 + n:]


def tensors(path):
    _, h, data = header(path)
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in h.items()}


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
for f in ("llama2c.safetensors", "tokenizer300.bin", "sp280.model", "text_sp.safetensors"):
    shutil.copy(os.path.join(FIX, f), WORK)
shutil.copytree(os.path.join(FIX, "corpus"), os.path.join(WORK, "corpus"))
SMALL = ["--batch", "2", "--no-progress", "--no-plot", "--threads", "1", "--eval-every", "2", "--dropout", "0"]

# 1. The imported llama2.c model with its tokenizer.bin, a training window shorter than its context.
base = run("eval", "--checkpoint", "llama2c.safetensors", "--text", "corpus", "--json", "-")
check(base.returncode != 0 and "without a tokenizer" in base.stderr, "eval refuses the import (no tokenizer)")
r = run("train", "--init-from", "llama2c.safetensors", "--task", "text", "--text", "corpus", "--tokenizer",
        "tokenizer300.bin", "--context", "16", "--steps", "4", "--stop-at", "2", "--out", "l2c", *SMALL)
check(r.returncode == 0 and "initialised from llama2c.safetensors" in r.stdout,
      f"fine-tune the import with tokenizer.bin: exit {r.returncode} {r.stderr.strip()[-300:]!r}")
r = run("train", "--resume", "l2c", "--no-progress", "--no-plot")
check(r.returncode == 0 and "RESULT val_bits_per_byte" in r.stdout, f"resume the fine-tune: {r.stderr.strip()[-300:]!r}")
model = os.path.join(WORK, "l2c", "model.safetensors")
if os.path.exists(model):
    meta, _, _ = header(model)
    check(meta.get("task") == "text" and meta.get("tokenizer") == "llama2c", f"a text model carrying the tokenizer: task "
          f"{meta.get('task')}, tokenizer {meta.get('tokenizer')}")
    check(meta.get("context") == "32" and meta.get("V_vocab") == "300" and meta.get("arch") == "llama" and
          meta.get("tie_embeddings") == "false", "the model's shape is the import's (context 32, not the window 16)")
    before, after = tensors(os.path.join(WORK, "llama2c.safetensors")), tensors(model)
    check(sorted(before) == sorted(after) and all(len(before[k]) == len(after[k]) for k in before),
          "the same tensors as the import")
    check(any(before[k] != after[k] for k in before), "training changed the weights")
    g = run("generate", "--checkpoint", model, "--prompt", "the", "--max-new", "12", "--temperature", "1", "--json", "-")
    check(g.returncode == 0, f"generate: {g.stderr.strip()!r}")
    if g.returncode == 0:
        j = json.loads(g.stdout)
        ids = [t["id"] for t in j["prompt"]["tokens"]] + [t["id"] for t in j["generated"]["tokens"]]
        d = run("tokenizer", "decode", "--tokenizer", "tokenizer300.bin", "--ids", " ".join(map(str, ids)))
        check(d.returncode == 0 and d.stdout == j["line"], f"generate's text is tokenizer.bin's decoding of its ids: "
              f"{d.stdout!r} vs {j['line']!r}")
        check(ids[0] == 1, "the prompt starts with BOS (a llama2.c tokenizer)")
    e = run("export", "llama2c", "l2c", "l2c.bin")
    check(e.returncode == 0, f"export llama2c: {e.stderr.strip()!r}")
    if e.returncode == 0:
        raw = open(os.path.join(WORK, "l2c.bin"), "rb").read()
        check(struct.unpack("<7i", raw[:28]) == (16, 32, 1, 2, 1, -300, 32), f"run.c's header {struct.unpack('<7i', raw[:28])}")
        i = run("import", "llama2c", "l2c.bin", "back.safetensors")
        check(i.returncode == 0 and tensors(os.path.join(WORK, "back.safetensors")) == after,
              f"import of the export gives back the fine-tuned weights bit for bit {i.stderr.strip()!r}")

have_sp = run("tokenizer", "encode", "--tokenizer", "sp280.model", "--string", "a").returncode == 0
if not have_sp:
    print("skipped: the SentencePiece cases (xgrad built without SentencePiece)")

# 2. A SentencePiece model of 280 pieces on the 300-id model: placeholders, never sampled.
r = run("train", "--init-from", "llama2c.safetensors", "--task", "text", "--text", "corpus", "--tokenizer",
        "sp280.model", "--steps", "2", "--out", "sp", *SMALL)
check(not have_sp or r.returncode == 0 and "sentencepiece" in r.stdout, f"fine-tune with a .model of 280 pieces: {r.stderr.strip()[-300:]!r}")
model = os.path.join(WORK, "sp", "model.safetensors")
if have_sp and os.path.exists(model):
    meta, _, _ = header(model)
    vocab = json.loads(meta["vocabulary"])
    check(len(vocab) == 300 and vocab[280:] == [f"<{i}>" for i in range(280, 300)] and meta["V_vocab"] == "300",
          f"ids 280..299 are placeholders: {vocab[278:282]}")
    seen = []
    for seed in range(4):
        g = run("generate", "--checkpoint", model, "--prompt", "the", "--max-new", "28", "--temperature", "1.5",
                "--seed", str(seed), "--json", "-")
        if g.returncode == 0:
            seen += [t["id"] for t in json.loads(g.stdout)["generated"]["tokens"]]
        else:
            check(False, f"generate seed {seed}: {g.stderr.strip()!r}")
    check(len(seen) > 50 and max(seen) < 280, f"{len(seen)} sampled ids, the largest {max(seen) if seen else None} < 280")
    g = run("generate", "--checkpoint", model, "--tokenizer", "sp280.model", "--prompt", "the", "--max-new", "4")
    check(g.returncode == 0, f"generate --tokenizer with the model's own smaller tokenizer: {g.stderr.strip()!r}")
    e = run("eval", "--checkpoint", model, "--text", "corpus", "--json", "-")
    check(e.returncode == 0 and json.loads(e.stdout)["tokenizer"]["vocab_size"] == 280, f"eval: {e.stderr.strip()!r}")
    e = run("export", "llama2c", model, "sp.bin")
    check(e.returncode == 0, f"export llama2c: {e.stderr.strip()!r}")

# 3. A SentencePiece text run (saved by the release before the model schema) continued on text.
r = run("train", "--init-from", "text_sp.safetensors", "--text", "corpus", "--tokenizer", "sp280.model", "--steps", "2",
        "--out", "tsp", *SMALL)
check(not have_sp or r.returncode == 0 and "initialised from" in r.stdout, f"fine-tune a SentencePiece text run: {r.stderr.strip()[-300:]!r}")
r = run("train", "--init-from", "text_sp.safetensors", "--text", "corpus", "--steps", "2", "--out", "tsp2", *SMALL)
check(not have_sp or r.returncode == 2 and "--tokenizer" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
      f"without its tokenizer: one line naming --tokenizer: {r.stderr.strip()!r}")

# 4. A model made in PyTorch with tools/xgrad_torch.py (task "custom", GPT-2 blocks, vocabulary 300):
# fine-tuned with the tokenizer.bin, then generated from (skipped without torch).
try:
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
    import torch  # noqa: F401
    import xgrad_torch
except ImportError:
    xgrad_torch = None
    print("skipped: the tools/xgrad_torch.py model (torch is not importable)")
if xgrad_torch is not None:
    torch.manual_seed(0)
    m = xgrad_torch.XgradGPT(xgrad_torch.Config(kind="gpt", V_vocab=300, context=16, d_model=16, H_q=2, layers=1))
    xgrad_torch.save_checkpoint(m, os.path.join(WORK, "torch.safetensors"))
    r = run("train", "--init-from", "torch.safetensors", "--out", "t0", *SMALL)
    check(r.returncode == 2 and "task 'custom'" in r.stderr and "--task text" in r.stderr,
          f"a torch model without --task: says how to fine-tune it: {r.stderr.strip()!r}")
    r = run("train", "--init-from", "torch.safetensors", "--task", "text", "--text", "corpus", "--tokenizer",
            "tokenizer300.bin", "--steps", "2", "--out", "torch", *SMALL)
    check(r.returncode == 0 and "initialised from" in r.stdout, f"fine-tune the torch model: {r.stderr.strip()[-300:]!r}")
    g = run("generate", "--checkpoint", "torch", "--prompt", "the", "--max-new", "4")
    check(g.returncode == 0 and g.stdout.startswith("the"), f"generate from it: {g.stdout!r} {g.stderr.strip()!r}")

print(f"{len(failures)} failures" if failures else "all passed")
sys.exit(1 if failures else 0)
