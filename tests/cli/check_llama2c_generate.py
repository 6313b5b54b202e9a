#!/usr/bin/env python3
"""xgrad generate --tokenizer tokenizer.bin end to end (docs/llama.md, docs/cli.md).

usage: check_llama2c_generate.py XGRAD WORKDIR

A Llama checkpoint whose greedy continuations are known in advance and a 300-piece
tokenizer.bin (tests/support/llama2c_fixture.py has both and works the ids out by hand):
- an empty prompt starts from BOS alone; the model's chain BOS -> " Once" -> " upon" -> " " ->
  <0xC3> -> <0xA9> -> BOS prints "Once upon é" (the space after BOS dropped, the byte pieces
  joined into one character) and stops when the model emits BOS; --json lists every step's id;
- "Once upon" is encoded as [1, 267, 274] and continues the same way; "zz" stops at EOS;
- without the stop, --max-new ends the run; the KV cache and the full recompute agree;
- a tokenizer of another size, an encoder-decoder, an empty prompt without a llama2.c tokenizer
  and a missing tokenizer file are one-line errors; --tokenizer bytes works on a byte model;
- xgrad tokenizer encode/decode read the tokenizer.bin.
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import llama2c_fixture as fx  # noqa: E402

XGRAD, WORK = sys.argv[1], sys.argv[2]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(*args):
    return subprocess.run([XGRAD, *args], cwd=WORK, capture_output=True, errors="replace", text=True, timeout=300)


def one_line_error(r, code, words, what):
    lines = r.stderr.strip().splitlines()
    check(r.returncode == code and len(lines) == 1 and lines[0].startswith("xgrad: ") and
          all(w in r.stderr for w in words), f"{what}: exit {r.returncode}, {r.stderr.strip()!r}")


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
byte_model, model, tok = fx.make_checkpoint(XGRAD, WORK)

GEN = ["generate", "--checkpoint", model, "--tokenizer", tok]
CHAIN_OUT = [fx.ONCE, fx.UPON, fx.SPACE, 0xC3 + 3, 0xA9 + 3, fx.BOS]

for cache in ([], ["--no-kv-cache"]):
    r = run(*GEN, "--prompt", "", "--max-new", "20", "--json", "-", *cache)
    check(r.returncode == 0, f"empty prompt {cache}: exit 0 ({r.stderr.strip()})")
    if r.returncode == 0:
        j = json.loads(r.stdout)
        check([t["id"] for t in j["prompt"]["tokens"]] == [fx.BOS], "empty prompt: the prompt is BOS alone")
        ids = [t["id"] for t in j["generated"]["tokens"]]
        check(ids == CHAIN_OUT, f"empty prompt {cache}: generated ids {ids}, want {CHAIN_OUT} (stops at BOS)")
        check([s["token"]["id"] for s in j["steps"]] == ids and [s["step"] for s in j["steps"]] == list(range(6)),
              "--json: every step's token id")
        check(j["generated"]["stopped_by"] == "stop_token", "stopped_by stop_token")
        check(j["line"] == "Once upon \u00e9" and j["generated"]["text"] == "Once upon \u00e9",
              f"decoded as run.c: {j['line']!r}")
        check(j["tokenizer"]["kind"] == "llama2c" and j["tokenizer"]["vocab_size"] == 300, "--json names the tokenizer")
        check([t["id"] for t in j["sampling"]["stop_tokens"]] == [fx.BOS, fx.EOS], "stop tokens BOS and EOS")

r = run(*GEN, "--prompt", "")
check(r.returncode == 0 and r.stdout == "Once upon \u00e9\n", f"printed line {r.stdout!r}")

r = run(*GEN, "--prompt", "Once upon", "--json", "-")
if r.returncode == 0:
    j = json.loads(r.stdout)
    check([t["id"] for t in j["prompt"]["tokens"]] == [fx.BOS, fx.ONCE, fx.UPON], "'Once upon' is [1, 267, 274]")
    ids = [t["id"] for t in j["generated"]["tokens"]]
    check(ids == CHAIN_OUT[2:], f"'Once upon' continues {ids}")
    check(j["line"] == "Once upon \u00e9", f"'Once upon' line {j['line']!r}")
else:
    check(False, f"'Once upon': {r.stderr.strip()}")

r = run(*GEN, "--prompt", "zz", "--json", "-")
if r.returncode == 0:
    j = json.loads(r.stdout)
    check([t["id"] for t in j["prompt"]["tokens"]] == [fx.BOS, fx.SPACE, fx.ZZ], "'zz' is [1, 259, 275]")
    check([t["id"] for t in j["generated"]["tokens"]] == [fx.EOS] and j["line"] == "zz" and
          j["generated"]["stopped_by"] == "stop_token", f"'zz' stops at EOS: {j['generated']}")
else:
    check(False, f"'zz': {r.stderr.strip()}")

r = run(*GEN, "--prompt", "", "--max-new", "3", "--json", "-")
if r.returncode == 0:
    j = json.loads(r.stdout)
    check([t["id"] for t in j["generated"]["tokens"]] == CHAIN_OUT[:3] and j["generated"]["stopped_by"] == "max_new",
          "--max-new 3 ends before the stop")
    check(j["line"] == "Once upon ", f"--max-new 3 line {j['line']!r}")

# A token the model never leads to: a zero embedding, all logits 0, id 0 (<unk>) every step.
r = run(*GEN, "--prompt", "c", "--max-new", "2", "--json", "-")
if r.returncode == 0:
    j = json.loads(r.stdout)
    check([t["id"] for t in j["generated"]["tokens"]] == [0, 0] and j["line"] == "c<unk><unk>",
          f"<unk> decodes as its piece: {j['line']!r}")

# Errors.
one_line_error(run("generate", "--checkpoint", byte_model, "--tokenizer", tok, "--prompt", "x"), 2,
               ["--tokenizer", "300", "256", "same size"], "a tokenizer of another size")
one_line_error(run("generate", "--checkpoint", model, "--prompt", ""), 2, ["--prompt must not be empty"],
               "an empty prompt without a llama2.c tokenizer")
one_line_error(run("generate", "--checkpoint", model, "--tokenizer", "missing.bin", "--prompt", "x"), 2,
               ["missing.bin", "does not exist"], "a missing tokenizer")
one_line_error(run("generate", "--checkpoint", model, "--tokenizer", tok, "--prompt", "x", "--json", tok), 2,
               ["--json", "--tokenizer", "same file"], "--json onto the tokenizer")
with open(os.path.join(WORK, "cut.bin"), "wb") as f:
    f.write(open(tok, "rb").read()[:-3])
one_line_error(run(*GEN[:3], "--tokenizer", "cut.bin", "--prompt", "x"), 1, ["cut.bin", "truncated"],
               "a truncated tokenizer.bin")

# --tokenizer bytes on the byte model: the same text as its own tokenizer.
a = run("generate", "--checkpoint", byte_model, "--prompt", "Once", "--max-new", "4")
b = run("generate", "--checkpoint", byte_model, "--tokenizer", "bytes", "--prompt", "Once", "--max-new", "4")
check(a.returncode == 0 and b.returncode == 0 and a.stdout == b.stdout and a.stdout.startswith("Once"),
      f"--tokenizer bytes: {a.stdout!r} {b.stdout!r} {b.stderr.strip()!r}")

# xgrad tokenizer encode / decode.
r = run("tokenizer", "encode", "--tokenizer", tok, "--string", "Once upon")
check(r.returncode == 0 and r.stdout == "1 267 274\n", f"tokenizer encode: {r.stdout!r} {r.stderr.strip()!r}")
r = run("tokenizer", "decode", "--tokenizer", tok, "--ids", "1 267 274 259 198 172 2")
check(r.returncode == 0 and r.stdout == "Once upon \u00e9", f"tokenizer decode: {r.stdout!r} {r.stderr.strip()!r}")

# train --task text trains with a tokenizer.bin (each document starts with BOS, as run.c's
# prompts do); tests/cli/check_fine_tune.py fine-tunes imported models with one.
r = run("train", "--task", "text", "--text", "corpus", "--tokenizer", tok, "--out", "t", "--steps", "1", "--d-model",
        "16", "--heads", "2", "--layers", "1", "--context", "8", "--batch", "2", "--no-progress", "--no-plot",
        "--threads", "1")
check(r.returncode == 0 and "tokenizer llama2c" in r.stdout, f"train --task text with a tokenizer.bin: {r.stderr.strip()!r}")

print(f"{len(failures)} failures" if failures else "all passed")
sys.exit(1 if failures else 0)
