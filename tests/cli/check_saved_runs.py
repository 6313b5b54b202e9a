#!/usr/bin/env python3
"""Runs and checkpoints saved by an earlier release still work (tests/fixtures/runs_v0).

usage: check_saved_runs.py XGRAD WORKDIR

- Each stopped run (sort with RoPE, GQA and a window; reverse; charlm) resumes to its last
  step: the log keeps the saved rows byte for byte and gains the missing ones, and the run's
  result line is printed.
- Each saved model.safetensors (as saved, and after the resume) loads in `generate` and
  `inspect`.
- The default job with --steps 3 writes the checkpoint headers of the saved one byte for byte
  (the random run id and the thread count aside: the default job now runs on the cores) and the
  same numbers (to float32 rounding across CPUs and thread counts).
"""
import hashlib
import json
import re
import math
import shutil
import struct
import subprocess
import sys
from pathlib import Path

XGRAD, WORK = sys.argv[1], Path(sys.argv[2])
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "runs_v0"
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(args, cwd):
    return subprocess.run([XGRAD] + args, cwd=cwd, capture_output=True, text=True, timeout=300)


def header(path):
    data = Path(path).read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return data[8:8 + n], data[8 + n:]


def float32s(blob):
    return struct.unpack("<%df" % (len(blob) // 4), blob)


if WORK.exists():
    shutil.rmtree(WORK)
shutil.copytree(FIXTURES, WORK)

prompts = {"sort": "3120|", "reverse": "123", "charlm": "the "}
for name in ("sort", "reverse", "charlm"):
    folder = WORK / name
    saved_log = (FIXTURES / name / "log.csv").read_text().splitlines()
    for model in ("model.safetensors",):
        g = run(["generate", "--checkpoint", str(folder / model), "--prompt", prompts[name], "--max-new", "2"], WORK)
        check(g.returncode == 0, f"{name}: generate loads the saved {model} ({g.stderr.strip()})")
        i = run(["inspect", "--checkpoint", str(folder / model)], WORK)
        check(i.returncode == 0, f"{name}: inspect loads the saved {model} ({i.stderr.strip()})")
    r = run(["train", "--resume", name, "--no-progress", "--no-plot"], WORK)
    check(r.returncode == 0, f"{name}: resumes ({r.stderr.strip()})")
    check("resumed at step 3" in r.stdout, f"{name}: resumed at the saved step 3")
    # 0.2.0 saved no thread count; its default was 1 thread, and the resumed run keeps it.
    check("resumed at step 3; 1 thread\n" in r.stdout, f"{name}: resumed with 1 thread, 0.2.0's default")
    check("RESULT " in r.stdout, f"{name}: prints its RESULT line")
    log = (folder / "log.csv").read_text().splitlines()
    check(log[:4] == saved_log[:4], f"{name}: the log keeps the header and saved rows byte for byte")
    check([row.split(",")[0] for row in log[1:]] == ["1", "2", "3", "4", "5", "6"],
          f"{name}: the log has steps 1..6 after the resume")
    g = run(["generate", "--checkpoint", str(folder / "model.safetensors"), "--prompt", prompts[name],
             "--max-new", "2"], WORK)
    check(g.returncode == 0, f"{name}: generate loads the resumed model ({g.stderr.strip()})")

# The default job's checkpoint, byte for byte but the run id and the version that wrote it
# (xgrad_version, which every safetensors file records: 0.2.0 in the fixtures).
out = WORK / "default_now"
r = run(["train", "--steps", "3", "--no-plot", "--no-progress", "--out", str(out)], WORK)
check(r.returncode == 0, f"default job --steps 3 runs ({r.stderr.strip()})")
saved_model_header, saved_model_data = header(FIXTURES / "default_steps3" / "model.safetensors")
model_header, model_data = header(out / "model.safetensors")


def as_version(h, version):
    """h with its xgrad_version entry's value set to `version`."""
    return re.sub(rb'"xgrad_version":"[^"]*"', b'"xgrad_version":"%s"' % version, h)


check(json.loads(saved_model_header)["__metadata__"]["xgrad_version"] == "0.2.0"
      and as_version(model_header, b"0.2.0") != model_header, "default job: the new model names another version")
check(as_version(model_header, b"0.2.0") == saved_model_header,
      "default job: model.safetensors header identical but for the version")
check(len(model_data) == len(saved_model_data), "default job: model.safetensors data the same size")
a, b = float32s(model_data), float32s(saved_model_data)
# Entries that stay below 1e-6 on both sides are left out: the key part of each attention's QKV
# bias has a zero gradient (it adds q . b_k to every score of a query's row, which the softmax
# ignores), so what it computes is rounding noise, which Adam's first steps scale to about 1e-8
# (g / (sqrt(v) + eps) with g far below eps); every trained parameter moves by far more.
noise = 1e-6
worst = max((abs(x - y) / (abs(y) + 1e-3) for x, y in zip(a, b) if max(abs(x), abs(y)) >= noise), default=math.inf)
check(worst < 1e-4, f"default job: parameters equal to float32 rounding (worst relative {worst:.2e})")
near_zero = sum(1 for x, y in zip(a, b) if max(abs(x), abs(y)) < noise)
check(near_zero < len(b) // 100, f"default job: {near_zero} of {len(b)} parameters at the noise level (under 1%)")
state_header, _ = header(out / "train_state.safetensors")
saved_state_header = (FIXTURES / "default_steps3" / "train_state.header.json").read_bytes()
mine, theirs = json.loads(state_header), json.loads(saved_state_header)
run_id = mine["__metadata__"]["run_id"]
check(len(run_id) == 32 and run_id != theirs["__metadata__"]["run_id"], "default job: a new run id of 32 hex digits")
# The default job now runs on the cores and saves their count ("threads", absent for 1 thread,
# as 0.2.0 wrote it); the header is 0.2.0's byte for byte but for that entry and the run id
# (and the padding to 8 bytes, which the entry's length moves).
used = re.search(r"; (\d+) threads?\n", r.stdout)
check(used is not None, "default job: the record names its thread count")
threads = int(used.group(1)) if used else 1
check(mine["__metadata__"].get("threads") == (None if threads == 1 else str(threads)),
      f"default job: the state records its {threads} thread(s)")
# Since then the state also records the digest of log.csv as committed with it ("log_sha256",
# which ties the log to the checkpoint); it must be the digest of the log the run wrote.
log_digest = mine["__metadata__"].get("log_sha256", "")
check(log_digest == hashlib.sha256((out / "log.csv").read_bytes()).hexdigest(),
      "default job: the state records the sha256 of its log.csv")
entry = b'"threads":"%d",' % threads if threads != 1 else b""
log_entry = b'"log_sha256":"%s",' % log_digest.encode()
# and the version that wrote it (as_version above: 0.2.0 then, the build's own now)
check(theirs["__metadata__"]["xgrad_version"] == "0.2.0" and as_version(state_header, b"0.2.0") != state_header,
      "default job: the fixture's state says 0.2.0, the new one names another version")
check(as_version(state_header, b"0.2.0").replace(run_id.encode(), theirs["__metadata__"]["run_id"].encode())
      .replace(entry, b"").replace(log_entry, b"").rstrip(b" ")
      == saved_state_header.rstrip(b" "),
      "default job: train_state.safetensors header identical but for the run id, thread count, log digest "
      "and version")
log_now = (out / "log.csv").read_text().splitlines()
log_then = (FIXTURES / "default_steps3" / "log.csv").read_text().splitlines()
check(log_now[0] == log_then[0], "default job: log.csv header identical")
check([r.split(",")[:2] for r in log_now[1:]] == [r.split(",")[:2] for r in log_then[1:]],
      "default job: log.csv steps and learning rates identical")
loss_now = [float(r.split(",")[2]) for r in log_now[1:]]
loss_then = [float(r.split(",")[2]) for r in log_then[1:]]
check(all(abs(x - y) < 1e-5 for x, y in zip(loss_now, loss_then)) and len(loss_now) == 3,
      f"default job: the same losses ({loss_now} vs {loss_then})")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all saved runs work")
