#!/usr/bin/env python3
"""Data-parallel training over Open MPI (docs/distributed.md), end to end.

    dist_test.py MODE --xgrad XGRAD --mpiexec MPIEXEC --work DIR [options]

Modes:
  selftest     dist_selftest (--selftest PATH) under 2 and 3 ranks.
  equivalence  one process and 2 ranks, same seed and global batch, dropout 0.1: the loss and
               gradient-norm curves and the final parameters agree (--dtype float64: to 1e-10
               per step for 20 steps; float32: to the reduction-order tolerance --tol).
  resume       a 2-rank run stopped at step 10 and resumed with 2 ranks ends bit-identical to
               the uninterrupted 2-rank run; resumed with 1 rank, and a 1-rank run resumed
               with 2, they agree with it to 1e-10 (float64).
  kill         SIGKILL one rank (alternately rank 1 and rank 0) at random moments of a run that
               checkpoints every step: the job ends with an error within --deadline seconds,
               the folder holds one consistent checkpoint, and resuming after every kill ends
               bit-identical to the uninterrupted run.
  failure      rank 0 cannot write its checkpoint (the run folder is moved away mid-run): it
               reports "rank 0 of 2: ..." and the job ends within --deadline seconds; the
               moved folder still holds a consistent checkpoint.
  usage        refusals under mpirun: --batch not divisible by the world size, ranks
               started with different options, a bad --dist-* flag, a bad --init-from, and
               generate / inspect / convert refusing: the exit status, one 'xgrad:' line.
  usage_stress each of those refusals --repeat times (20), --parallel jobs at a time (--only
               NAME: those whose name contains NAME).
  heldout      `mpirun -np 2 xgrad train` with the defaults reaches the same held-out RESULT
               as one process (the single-process main job's, --expect-file).

mpirun gets --oversubscribe, and --allow-run-as-root when running as root (CI); the
environment pins Open MPI to shared memory on one machine (see ENV below).
"""
import argparse
import atexit
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "robustness"))
import kill_test  # noqa: E402  (check_consistent, compare: the single-process kill test's checks)

# Open MPI on one machine, in a container: shared memory only (no network interface probing),
# no ssh needed to start local ranks (plm isolated), no CMA single-copy (blocked by container
# seccomp/ptrace rules), and waiting ranks yield the core (two jobs may share 2 cores under ctest -j2).
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_btl="self,vader", OMPI_MCA_pml="ob1", OMPI_MCA_plm="isolated",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
ENV.pop("XGRAD_MPI", None)
# Under AddressSanitizer (scripts/sanitize.sh), processes that initialise MPI: Open MPI keeps
# allocations until exit on purpose. Its plugins stay loaded and allocations are unwound fully
# (Open MPI has no frame pointers) so that lsan_openmpi.supp can name them; xgrad's own leaks
# are still reported. Harmless without ASan.
MPI_ENV = dict(ENV, OMPI_MCA_mca_base_component_disable_dlclose="1", PMIX_MCA_mca_base_component_disable_dlclose="1")
# A rank killed inside MPI_Init leaves PMIx's shared-memory key store (gds ds21/ds12) locked,
# and mpirun then hangs in PMIx_server_finalize (7 of 40 such kills here); the hash store has no
# shared lock (docs/distributed.md, Failures).
MPI_ENV["PMIX_MCA_gds"] = "hash"
# Each mpiexec keeps Open MPI's session directories in a folder of its own (mpi_env()). In a
# shared /tmp/ompi.<host>.<uid>, two mpiexec starting at once under ctest -j2 raced: one removed
# the folder as it finished while the other created its own inside ("A call to mkdir was unable
# to create the desired directory ... File exists", 3 of 460 runs; a scratch loop of four
# concurrent `mpiexec -np 1 true` failed 2 of 1,680 launches that way and none of 960 with a
# folder each). A folder per test process was not enough: usage_stress starts 4 jobs at once
# from one process (1 of 1,680 such launches failed with one shared folder, "No such file or
# directory"). The folders live in one per test process, removed at exit.
SESSION_DIR = tempfile.mkdtemp(prefix="xg-ompi-")
atexit.register(shutil.rmtree, SESSION_DIR, ignore_errors=True)
MPI_ENV["ASAN_OPTIONS"] = ":".join(x for x in (os.environ.get("ASAN_OPTIONS"), "fast_unwind_on_malloc=0") if x)
MPI_ENV["LSAN_OPTIONS"] = ":".join(
    x for x in (os.environ.get("LSAN_OPTIONS"),
                "suppressions=" + os.path.join(os.path.dirname(os.path.abspath(__file__)), "lsan_openmpi.supp")) if x)


def mpi_env():
    """MPI_ENV with a session folder of this launch's own."""
    return dict(MPI_ENV, OMPI_MCA_orte_tmpdir_base=tempfile.mkdtemp(prefix="job-", dir=SESSION_DIR))


SMALL = ["--batch", "8", "--d-model", "16", "--heads", "2", "--layers", "1", "--threads", "1", "--no-progress",
         "--no-plot", "--seed", "3", "--dropout", "0.1"]
TASKS = {"sort": ["--task", "sort", "--n-digits", "4"], "reverse": ["--task", "reverse"],
         "charlm": ["--task", "charlm", "--context", "16"]}


def fail(msg):
    sys.exit(f"FAILED: {msg}")


class Runner:
    def __init__(self, a):
        self.xgrad = os.path.abspath(a.xgrad)
        self.mpiexec = a.mpiexec
        self.work = os.path.abspath(a.work)
        os.makedirs(self.work, exist_ok=True)

    def mpirun(self, np_):
        cmd = [self.mpiexec, "-np", str(np_), "--oversubscribe"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        return cmd

    def command(self, np_, args):
        return ([self.xgrad] if np_ == 0 else self.mpirun(np_) + [self.xgrad]) + ["train"] + args

    def start(self, np_, args):
        """np_ 0: a plain process; N: mpirun -np N."""
        return subprocess.Popen(self.command(np_, args), env=mpi_env() if np_ else ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def run(self, np_, args, timeout=600, expect=0):
        p = self.start(np_, args)
        out, err = p.communicate(timeout=timeout)
        out, err = out.decode(), err.decode()
        if expect is not None and p.returncode != expect:
            fail(f"{' '.join(self.command(np_, args))}: exit {p.returncode}, expected {expect}\n{out}\n{err}")
        return p.returncode, out, err

    def fresh(self, name):
        d = os.path.join(self.work, name)
        shutil.rmtree(d, ignore_errors=True)
        return d


def log_columns(folder):
    rows = [r for r in kill_test.log_rows(os.path.join(folder, "log.csv")) if r]
    return [[float(x) for x in r.split(",")[1:4]] for r in rows]  # lr, loss, grad_norm


def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dt = {"F32": np.float32, "F64": np.float64}[e["dtype"]]
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[b:end], dtype=dt).astype(np.float64)
    return out


def compare_runs(a, b, tol, what):
    """Worst per-step |difference| of loss and grad norm, and of the final parameters."""
    ca, cb = log_columns(a), log_columns(b)
    if len(ca) != len(cb):
        fail(f"{what}: {len(ca)} and {len(cb)} logged steps")
    loss = max(abs(x[1] - y[1]) for x, y in zip(ca, cb))
    gnorm = max(abs(x[2] - y[2]) for x, y in zip(ca, cb))
    lr = max(abs(x[0] - y[0]) for x, y in zip(ca, cb))
    ta, tb = tensors(os.path.join(a, "model.safetensors")), tensors(os.path.join(b, "model.safetensors"))
    params = max(float(np.max(np.abs(ta[k] - tb[k]))) for k in ta)
    print(f"{what}: {len(ca)} steps; max |loss diff| {loss:.3g}, max |grad-norm diff| {gnorm:.3g}, "
          f"max |parameter diff| {params:.3g} (tolerance {tol:g})", flush=True)
    if lr != 0:
        fail(f"{what}: the learning rates differ")
    if not (loss <= tol and gnorm <= tol and params <= tol):
        fail(f"{what}: differences above the tolerance {tol:g}")


def selftest(r, a):
    for np_ in (2, 3):
        p = subprocess.run(r.mpirun(np_) + [os.path.abspath(a.selftest)], env=mpi_env(), capture_output=True,
                           timeout=300)
        out = p.stdout.decode() + p.stderr.decode()
        print(out[-2000:])
        if p.returncode != 0 or f"dist_selftest: {np_} ranks, all passed" not in out:
            fail(f"dist_selftest with {np_} ranks: exit {p.returncode}")


def equivalence(r, a):
    base = TASKS[a.task] + SMALL + ["--steps", "20", "--dtype", a.dtype]
    one, two = r.fresh(f"eq-{a.task}-{a.dtype}-1"), r.fresh(f"eq-{a.task}-{a.dtype}-2")
    r.run(0, base + ["--out", one])
    many = base
    if a.grad_accum > 1:  # the same global batch as K micro-batches of batch / K on the ranks
        many = base[:]
        i = many.index("--batch") + 1
        many[i] = str(int(many[i]) // a.grad_accum)
        many += ["--grad-accum", str(a.grad_accum)]
    _, out, _ = r.run(2, many + ["--out", two, "--dist-check-every", "1"] + (["--dist-overlap"] if a.overlap else []))
    # One final metric line (charlm, the text task, prints train_loss and best_val_loss RESULT
    # lines before it).
    finals = [ln for ln in out.splitlines()
              if ln.startswith(("RESULT heldout_exact_match ", "RESULT val_loss ", "RESULT val_bits_per_byte "))]
    if len(finals) != 1 or "data parallel:" not in out:
        fail(f"2 ranks: expected one final RESULT line and the data-parallel summary:\n{out}")
    compare_runs(one, two, a.tol, f"{a.task} {a.dtype}, 1 process vs 2 ranks" + (" (overlap)" if a.overlap else "") +
                 (f" accumulating {a.grad_accum} micro-batches" if a.grad_accum > 1 else ""))


def resume(r, a):
    base = TASKS["sort"] + SMALL + ["--steps", "20", "--dtype", "float64", "--checkpoint-every", "5"]
    ref = r.fresh("resume-ref")
    r.run(2, base + ["--out", ref])
    # Same world size: bit-identical.
    same = r.fresh("resume-2-2")
    r.run(2, base + ["--out", same, "--stop-at", "10"])
    r.run(2, ["--resume", same, "--no-progress", "--no-plot"])
    kill_test.compare(ref, same, "2 ranks stopped at step 10, resumed with 2 ranks")
    print("2 ranks -> 2 ranks: bit-identical to the uninterrupted run", flush=True)
    # Another world size: the same global batches and dropout masks, reduction order aside.
    down = r.fresh("resume-2-1")
    r.run(2, base + ["--out", down, "--stop-at", "10"])
    r.run(0, ["--resume", down, "--no-progress", "--no-plot"])
    compare_runs(ref, down, 1e-10, "2 ranks stopped at step 10, resumed as 1 process")
    up = r.fresh("resume-1-2")
    r.run(0, base + ["--out", up, "--stop-at", "10"])
    r.run(2, ["--resume", up, "--no-progress", "--no-plot"])
    compare_runs(ref, up, 1e-10, "1 process stopped at step 10, resumed with 2 ranks")
    # A saved run whose global batch does not divide among the new world size.
    odd = r.fresh("resume-odd")
    r.run(0, TASKS["sort"] + SMALL[2:] + ["--batch", "9", "--steps", "4", "--stop-at", "2", "--out", odd])
    _, _, err = r.run(2, ["--resume", odd], expect=2)
    if "the resumed run's --batch 9 does not divide among 2 ranks" not in err:
        fail(f"resume with an indivisible batch: {err}")


def rank_pids(mpirun_pid):
    """{rank: pid} of the ranks mpirun started (its children, read from /proc)."""
    pids = {}
    try:
        tids = os.listdir(f"/proc/{mpirun_pid}/task")
    except FileNotFoundError:
        return pids
    for tid in tids:
        try:
            with open(f"/proc/{mpirun_pid}/task/{tid}/children") as f:
                children = [int(x) for x in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
        for c in children:
            try:
                with open(f"/proc/{c}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            if b"OMPI_COMM_WORLD_RANK" in env:
                pids[int(env[b"OMPI_COMM_WORLD_RANK"])] = c
    return pids


def kill(r, a):
    rng = random.Random(a.seed)
    base = TASKS["sort"] + SMALL + ["--steps", str(a.steps), "--checkpoint-every", "1"]
    ref = r.fresh("kill-ref")
    t0 = time.time()
    r.run(2, base + ["--out", ref])
    run_time = time.time() - t0
    out = r.fresh("kill-run")
    landed, last, t_kill = 0, -1, 0.0
    while True:
        started = os.path.exists(os.path.join(out, "train_state.safetensors"))
        args = ["--resume", out, "--no-progress", "--no-plot"] if started else base + ["--out", out, "--overwrite"]
        p = r.start(2, args)
        victim = 1 if landed % 2 == 0 else 0  # rank 1 first, then rank 0, ...
        if landed < a.kills:
            pids = {}
            t_start = time.time()
            while len(pids) < 2 and p.poll() is None and time.time() - t_start < 30:
                pids = rank_pids(p.pid)
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, min(1.0, run_time / 2)))
            if victim in pids:
                try:
                    os.kill(pids[victim], signal.SIGKILL)
                except ProcessLookupError:
                    pass
            t_kill = time.time()
        try:
            _, err = p.communicate(timeout=a.deadline if landed < a.kills else 600)
        except subprocess.TimeoutExpired:
            diag = subprocess.run(["bash", "-c", f"ps -ef --forest | grep -v grep | grep -A5 {p.pid}; for q in $(pgrep -f 'xgrad train'); do echo == $q; cat /proc/$q/status | grep -E 'State|SigCgt|SigBlk|SigPnd|ShdPnd'; gdb -p $q -batch -ex 'thread apply all bt 8' 2>/dev/null | grep -E '^#|^Thread'; done"], capture_output=True, text=True).stdout
            print("DIAG\n" + diag, flush=True)
            p.kill()
            p.communicate()
            fail(f"the job did not end within {a.deadline} s after rank {victim} was killed (a hang)")
        err = err.decode()
        if p.returncode != 0 and landed < a.kills:
            landed += 1
            ended = time.time() - t_kill
            # Open MPI can report a rank killed at the edge of its MPI life (as it finalizes) as a
            # normal termination with exit code 137 (128 + SIGKILL) instead of "exited on signal 9".
            after_finalize = p.returncode == 137 and "returned a non-zero exit code" in err
            if "exited on signal 9" not in err and not after_finalize:
                fail(f"kill {landed} (rank {victim}): mpirun exited {p.returncode} without saying a rank was killed:\n{err}")
            if after_finalize:
                print(f"kill {landed}: rank {victim}'s SIGKILL was reported as exit code 137:\n{err}", flush=True)
            s = kill_test.check_consistent(out, f"after kill {landed}") if os.path.isdir(out) else 0
            print(f"kill {landed}: rank {victim} killed; the job ended {ended:.1f} s later with exit {p.returncode}; "
                  f"checkpoint at step {s}", flush=True)
            if s < last:
                fail(f"kill {landed}: the checkpoint went back from step {last} to {s}")
            last = s
            continue
        if p.returncode != 0:
            fail(f"a run exited {p.returncode}:\n{err}")
        if landed >= a.kills:
            break
        kill_test.compare(ref, out, "a run that finished before the kill")
        shutil.rmtree(out)
        last = -1
    kill_test.compare(ref, out, f"after {landed} kills")
    print(f"kill test: {landed} kills, each ended the job in bounded time; the resumed run is bit-identical "
          "to the uninterrupted one")


def failure(r, a):
    out = r.fresh("fail-run")
    moved = r.fresh("fail-moved")
    p = r.start(2, TASKS["sort"] + SMALL + ["--steps", "100000", "--checkpoint-every", "1", "--out", out])
    t0 = time.time()
    while not os.path.exists(os.path.join(out, "train_state.safetensors")):
        if p.poll() is not None or time.time() - t0 > 60:
            fail(f"the run ended or never checkpointed: {p.communicate()}")
        time.sleep(0.01)
    time.sleep(0.2)
    os.rename(out, moved)
    t_moved = time.time()
    try:
        _, err = p.communicate(timeout=a.deadline)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        fail(f"the job did not end within {a.deadline} s of rank 0's failure (a hang)")
    err = err.decode()
    print(err)
    if p.returncode == 0:
        fail("the job succeeded although rank 0 could not write its checkpoint")
    line = [ln for ln in err.splitlines() if ln.startswith("xgrad: rank 0 of 2: ")]
    if not line or out not in line[0]:
        fail("no message 'xgrad: rank 0 of 2: ...' naming the folder on stderr")
    s = kill_test.check_consistent(moved, "the moved folder")
    print(f"rank 0 failed to write; the job ended {time.time() - t_moved:.1f} s later with exit {p.returncode}; "
          f"the moved folder holds a consistent checkpoint at step {s}")


def refusals(r):
    """Every refusal under mpirun: (name, command, exit status, a key of the one 'xgrad:' line).

    train checks its command line before MPI starts (a flag, --init-from) or after, every rank
    together (--batch 7, ranks started with other options, a resumed batch that does not
    divide); generate, inspect and convert never start MPI: each rank runs alone and rank 0
    alone reports."""
    fixture = os.path.join(r.work, "usage-fixture")  # a small single-process run, made once
    model = os.path.join(fixture, "model.safetensors")
    if not os.path.exists(model):
        shutil.rmtree(fixture, ignore_errors=True)
        r.run(0, TASKS["sort"] + SMALL[2:] + ["--batch", "9", "--steps", "4", "--stop-at", "2", "--out", fixture])
    out = os.path.join(r.work, "usage")  # never created
    xgrad = r.xgrad
    mpmd = r.mpirun(1) + [xgrad, "train", "--steps", "5", "--out", out, ":", "-np", "1", xgrad, "train", "--steps", "6",
                          "--out", out]
    cases = [
        ("train --batch 7", r.command(2, ["--batch", "7", "--out", out]), 2,
         "--batch 7 does not divide among 2 ranks: --batch is the global batch"),
        ("train --dist-check-every -1", r.command(2, ["--dist-check-every", "-1", "--out", out]), 2,
         "--dist-check-every -1"),
        ("train --dist-check-every 0x10", r.command(2, ["--dist-check-every", "0x10", "--out", out]), 2,
         "--dist-check-every: must be an integer, got '0x10'"),
        ("train --dist-bucket-kib 0", r.command(2, ["--dist-bucket-kib", "0", "--out", out]), 2, "--dist-bucket-kib 0"),
        ("train --dtype float16", r.command(2, ["--dtype", "float16", "--out", out]), 2, "--dtype"),
        ("train, ranks with other options", mpmd, 2, "rank 1 was started with other options than rank 0 (steps 5 -> 6)"),
        ("train, --resume on rank 0 only", r.mpirun(1) + [xgrad, "train", "--resume", fixture, ":", "-np", "1", xgrad,
                                                         "train", "--steps", "6", "--out", out], 2,
         "rank 1 was started without --resume and rank 0 with it"),
        ("train --resume, batch 9 on 2 ranks", r.command(2, ["--resume", fixture]), 2,
         "the resumed run's --batch 9 does not divide among 2 ranks"),
        ("train --init-from train_state", r.command(2, ["--init-from", os.path.join(fixture, "train_state.safetensors"),
                                                        "--out", out]), 1, "lacks 'model'"),
        ("generate --temperature nan", r.mpirun(2) + [xgrad, "generate", "--checkpoint", model, "--prompt", "12",
                                                      "--temperature", "nan"], 2, "--temperature"),
        ("inspect --json /proc/x.json", r.mpirun(2) + [xgrad, "inspect", "--checkpoint", model, "--json", "/proc/x.json"], 2,
         "--json '/proc/x.json'"),
        ("convert --kv-heads 3", r.mpirun(2) + [xgrad, "convert", "--kv-heads", "3", model, os.path.join(r.work, "c.st")],
         2, "--kv-heads 3"),
    ]
    return cases, out


def refuse_once(cmd, status, key):
    """None when the refusal is right: exit `status`, one 'xgrad:' line with `key`, nothing on stdout."""
    p = subprocess.run(cmd, env=mpi_env(), capture_output=True, timeout=120)
    err = p.stderr.decode()
    lines = [ln for ln in err.splitlines() if ln.startswith("xgrad:")]
    if p.returncode != status:
        return f"exit {p.returncode}, expected {status}; 'xgrad:' lines {lines}"
    if len(lines) != 1 or key not in lines[0]:
        return f"expected one 'xgrad:' line with {key!r}, got {lines}"
    if p.stdout.decode().strip():
        return f"printed on stdout: {p.stdout.decode()[:300]}"
    return None


def usage(r, a):
    cases, out = refusals(r)
    problems = []
    for name, cmd, status, key in cases:
        problem = refuse_once(cmd, status, key)
        print(f"{name}: {problem or 'one line, exit ' + str(status)}", flush=True)
        if problem:
            problems.append(f"{' '.join(cmd)}: {problem}")
        if os.path.exists(out):
            problems.append(f"{name}: a refused run created its folder")
            shutil.rmtree(out)
    if problems:
        fail("\n".join(problems))


def usage_stress(r, a):
    """Each refusal --repeat times, --parallel jobs at a time (other jobs share the cores: the
    ranks of a job do not start or finish together). One wrong outcome fails the test."""
    from concurrent.futures import ThreadPoolExecutor
    cases, out = refusals(r)
    cases = [c for c in cases if a.only in c[0]]
    runs = [c for c in cases for _ in range(a.repeat)]
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=a.parallel) as pool:
        problems = list(pool.map(lambda c: refuse_once(c[1], c[2], c[3]), runs))
    bad = {}
    for (name, cmd, _, _), problem in zip(runs, problems):
        if problem:
            bad.setdefault(name, []).append(problem)
    for name, _, _, _ in cases:
        print(f"{name}: {a.repeat - len(bad.get(name, []))}/{a.repeat} right", flush=True)
    print(f"{len(runs)} refused jobs in {time.time() - t0:.0f} s, {a.parallel} at a time")
    if os.path.exists(out):
        fail("a refused run created its folder")
    if bad:
        fail("; ".join(f"{name}: {len(p)} wrong, e.g. {p[0]}" for name, p in bad.items()))


def heldout(r, a):
    with open(a.expect_file) as f:
        expected = float(f.read().split()[0])
    out = r.fresh("heldout")
    _, text, _ = r.run(2, ["--out", out, "--no-progress"], timeout=1800)
    print(text)
    results = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    if len(results) != 1:
        fail(f"expected one RESULT line, got {results}")
    got = float(results[0].split()[2])
    print(f"held-out exact match: 2 ranks {got}, 1 process {expected}")
    if got < 0.99 or got != expected:
        fail(f"2 ranks reached {got}, one process {expected}")
    for f in ("model.safetensors", "train_state.safetensors", "log.csv", "loss.png"):
        if not os.path.getsize(os.path.join(out, f)):
            fail(f"{f} missing")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["selftest", "equivalence", "resume", "kill", "failure", "usage", "usage_stress",
                                     "heldout"])
    ap.add_argument("--xgrad", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--selftest")
    ap.add_argument("--task", default="sort", choices=sorted(TASKS))
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--tol", type=float, default=1e-10)
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=30.0)
    ap.add_argument("--expect-file")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--only", default="", help="usage_stress: the refusals whose name contains this")
    a = ap.parse_args()
    r = Runner(a)
    globals()[a.mode](r, a)


if __name__ == "__main__":
    main()
