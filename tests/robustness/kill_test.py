#!/usr/bin/env python3
"""Interruptions of `xgrad train` (docs/reliability.md).

    kill_test.py kill XGRAD WORKDIR [--kills 20] [--seed 1]
        SIGKILL at random moments of a run that checkpoints every step, then --resume, until
        at least --kills kills have landed. After every kill the folder must hold one
        consistent checkpoint (train_state step s; model.safetensors from step s or s - 1; the
        log's first s rows complete and numbered 1..s); the run that finally completes must
        end with files bit-identical to an uninterrupted run's (train_state.safetensors but
        for its run id, which every resume keeps, model.safetensors, and log.csv's
        step/lr/loss/grad_norm columns).
    kill_test.py signals XGRAD WORKDIR
        SIGINT and SIGTERM: the step finishes, a checkpoint and the log are written, exit
        130 / 143, and --resume ends bit-identical to the uninterrupted run; two SIGINTs in a
        row exit 130 at once, leaving the last complete checkpoint.
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time

ENV = dict(os.environ, OMP_NUM_THREADS="1")
RUN = ["--n-digits", "4", "--batch", "8", "--d-model", "16", "--heads", "2", "--layers", "1", "--threads", "1",
       "--checkpoint-every", "1", "--no-progress", "--no-plot", "--seed", "3", "--dropout", "0.1"]


def fail(msg):
    sys.exit(f"FAILED: {msg}")


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def step_of(path):
    return int(header(path)["__metadata__"]["step"])


def log_rows(path):
    with open(path, "rb") as f:
        lines = f.read().decode().split("\n")
    # The text task (and --task charlm, one of its forms) adds a val_bpb column.
    if lines[0] not in ("step,lr,loss,grad_norm,tokens_per_s,elapsed_s,val_loss",
                        "step,lr,loss,grad_norm,tokens_per_s,elapsed_s,val_loss,val_bpb"):
        fail(f"{path}: header line is {lines[0]!r}")
    return lines[1:]


def check_consistent(out, context):
    """The folder after an interruption: one checkpoint, and a log that holds its steps."""
    state = os.path.join(out, "train_state.safetensors")
    if not os.path.exists(state):
        return 0
    s = step_of(state)  # a torn file would fail to parse here
    model = os.path.join(out, "model.safetensors")
    if os.path.exists(model):
        m = step_of(model)
        if m not in (s, s - 1):
            fail(f"{context}: model.safetensors at step {m}, train_state at step {s}")
    rows = log_rows(os.path.join(out, "log.csv"))
    for i in range(s):
        fields = rows[i].split(",") if i < len(rows) else []
        if len(fields) != 7 or fields[0] != str(i + 1):
            fail(f"{context}: log.csv row {i + 1} is {rows[i] if i < len(rows) else None!r} with the checkpoint at step {s}")
    return s


def run_id(out, context):
    """The run id of the folder's state, which run_id.txt must repeat (docs/reliability.md)."""
    ident = header(os.path.join(out, "train_state.safetensors"))["__metadata__"].get("run_id")
    with open(os.path.join(out, "run_id.txt")) as f:
        text = f.read()
    if not ident or text != ident + "\n":
        fail(f"{context}: the state's run id {ident!r}, run_id.txt holds {text!r}")
    return ident


def without_run_id(path):
    """The bytes of a state file with its run id (32 hex digits, the only thing two runs with
    the same flags do not share) blanked, after checking it is there; likewise its log_sha256,
    the digest of the log.csv beside it (whose timing columns differ between runs), after
    checking it is that log's digest."""
    with open(path, "rb") as f:
        raw = f.read()
    meta = header(path)["__metadata__"]
    ident = meta["run_id"]
    key = b'"run_id":"' + ident.encode() + b'"'
    if len(ident) != 32 or raw.count(key) != 1:
        fail(f"{path}: no single run id in the header")
    digest = meta.get("log_sha256", "")
    with open(os.path.join(os.path.dirname(path), "log.csv"), "rb") as f:
        if digest != hashlib.sha256(f.read()).hexdigest():
            fail(f"{path}: log_sha256 {digest!r} is not the digest of the log.csv beside it")
    raw = raw.replace(b'"log_sha256":"' + digest.encode() + b'"', b'"log_sha256":"' + b"-" * 64 + b'"')
    return raw.replace(key, b'"run_id":"' + b"-" * 32 + b'"')


def compare(ref, out, context):
    """Bit-identical to the uninterrupted run, but for the run id (each run has its own)."""
    with open(os.path.join(ref, "model.safetensors"), "rb") as a, open(os.path.join(out, "model.safetensors"), "rb") as b:
        if a.read() != b.read():
            fail(f"{context}: model.safetensors differs from the uninterrupted run's")
    name = "train_state.safetensors"
    if without_run_id(os.path.join(ref, name)) != without_run_id(os.path.join(out, name)):
        fail(f"{context}: {name} differs from the uninterrupted run's (the run id aside)")
    run_id(out, context)
    cols = lambda rows: [r.split(",")[:4] for r in rows if r]
    if cols(log_rows(os.path.join(ref, "log.csv"))) != cols(log_rows(os.path.join(out, "log.csv"))):
        fail(f"{context}: log.csv's step/lr/loss/grad_norm columns differ from the uninterrupted run's")


def train(xgrad, args, **kw):
    return subprocess.Popen([xgrad, "train"] + args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def reference(xgrad, work, steps):
    ref = os.path.join(work, "reference")
    shutil.rmtree(ref, ignore_errors=True)
    p = train(xgrad, RUN + ["--steps", str(steps), "--out", ref])
    _, err = p.communicate(timeout=600)
    if p.returncode != 0:
        fail(f"the uninterrupted run failed: {err.decode()}")
    return ref


def kill_test(xgrad, work, kills, seed, steps):
    rng = random.Random(seed)
    ref = reference(xgrad, work, steps)
    t0 = time.time()
    p = train(xgrad, RUN + ["--steps", str(steps), "--out", ref + "-timing"])
    p.communicate(timeout=600)
    run_time = time.time() - t0
    out = os.path.join(work, "killed")
    shutil.rmtree(out, ignore_errors=True)
    landed, last = 0, -1
    ident = None  # the run id of the run in `out`: every resume keeps it
    while True:
        started = os.path.exists(os.path.join(out, "train_state.safetensors"))
        if not started:
            ident = None
        args = ["--resume", out] if started else RUN + ["--steps", str(steps), "--out", out, "--overwrite"]
        p = train(xgrad, args)
        if landed < kills:
            # Somewhere in the run: start-up, a step, or the middle of a checkpoint.
            time.sleep(rng.uniform(0.0, min(0.5, run_time / 3)))
            p.send_signal(signal.SIGKILL)
        _, err = p.communicate(timeout=600)
        if p.returncode == -signal.SIGKILL:
            landed += 1
            s = check_consistent(out, f"after kill {landed}")
            print(f"kill {landed}: checkpoint at step {s}", flush=True)
            if s > 0:
                now = run_id(out, f"after kill {landed}")
                if ident is not None and now != ident:
                    fail(f"kill {landed}: the run id changed from {ident} to {now}")
                ident = now
            if s < last:
                fail(f"kill {landed}: the checkpoint went back from step {last} to {s}")
            last = s
            continue
        if p.returncode != 0:
            fail(f"a run exited {p.returncode}: {err.decode()}")
        if landed >= kills:
            break
        # The run finished before the kill: start over with a fresh folder for more kills.
        compare(ref, out, "a run that finished between kills")
        if ident is not None and run_id(out, "a run that finished between kills") != ident:
            fail("the run id changed on resume")
        shutil.rmtree(out)
        last = -1
    compare(ref, out, f"after {landed} kills")
    if ident is not None and run_id(out, "at the end") != ident:
        fail(f"the run id changed from {ident} to {run_id(out, 'at the end')}")
    print(f"kill test: {landed} kills, the resumed run is bit-identical to the uninterrupted one (run id aside; "
          f"kept by every resume)")


def signals_test(xgrad, work, steps):
    ref = reference(xgrad, work, steps)
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        out = os.path.join(work, f"sig{int(sig)}")
        shutil.rmtree(out, ignore_errors=True)
        p = train(xgrad, RUN + ["--steps", str(steps), "--out", out])
        while not os.path.exists(os.path.join(out, "train_state.safetensors")) and p.poll() is None:
            time.sleep(0.01)
        p.send_signal(sig)
        stdout, err = p.communicate(timeout=120)
        if p.returncode != code:
            fail(f"{sig.name}: exit {p.returncode}, expected {code}; stderr {err.decode()!r}")
        s = check_consistent(out, sig.name)
        rows = [r for r in log_rows(os.path.join(out, "log.csv")) if r]
        if len(rows) != s or step_of(os.path.join(out, "model.safetensors")) != s:
            fail(f"{sig.name}: stopped with state at step {s}, model at "
                 f"{step_of(os.path.join(out, 'model.safetensors'))}, {len(rows)} log rows")
        if b"interrupted by signal" not in err or b"--resume" not in err:
            fail(f"{sig.name}: stderr does not say how to resume: {err.decode()!r}")
        p = train(xgrad, ["--resume", out])
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            fail(f"{sig.name}: resume failed: {err.decode()}")
        compare(ref, out, f"resumed after {sig.name}")
        print(f"{sig.name}: exit {code} after step {s}; resumed bit-identical", flush=True)
    # Two SIGINTs in a row: out at once, the last complete checkpoint intact.
    out = os.path.join(work, "twice")
    shutil.rmtree(out, ignore_errors=True)
    bigger = RUN[:]  # steps of tens of milliseconds: the second signal lands inside one
    for flag, value in (("--d-model", "64"), ("--heads", "4"), ("--batch", "64")):
        bigger[bigger.index(flag) + 1] = value
    p = train(xgrad, bigger + ["--steps", str(steps), "--out", out])
    while not os.path.exists(os.path.join(out, "train_state.safetensors")) and p.poll() is None:
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    first = b"\n"
    while first == b"\n":
        first = p.stderr.readline()  # the handler's notice: the first signal has been taken
    if b"stopping after this step" not in first:
        fail(f"first SIGINT: no notice on stderr ({first!r})")
    p.send_signal(signal.SIGINT)  # (two signals sent at once would merge into one)
    _, err = p.communicate(timeout=120)
    if p.returncode != 130:
        fail(f"second SIGINT: exit {p.returncode}, expected 130; stderr: {err.decode(errors='replace')[-1500:]!r}")
    if b"checkpoint written" in err:
        fail("second SIGINT: the run finished its step and wrote a checkpoint instead of leaving at once")
    check_consistent(out, "second SIGINT")
    print("two SIGINTs: exit 130 at once; the checkpoint on disk is consistent")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["kill", "signals"])
    ap.add_argument("xgrad")
    ap.add_argument("work")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    if a.mode == "kill":
        kill_test(os.path.abspath(a.xgrad), os.path.abspath(a.work), a.kills, a.seed, a.steps)
    else:
        signals_test(os.path.abspath(a.xgrad), os.path.abspath(a.work), a.steps)


if __name__ == "__main__":
    main()
