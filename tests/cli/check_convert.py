#!/usr/bin/env python3
"""`xgrad convert` and `xgrad train --init-from` end to end (docs/cli.md, convert):

    check_convert.py XGRAD WORKDIR

Trains a tiny 4-head sort model for a few steps, converts it to 2 and 1 key/value heads
(text and --json reports agree; the original's held-out exact match is the training run's
RESULT), checks the errors (G that does not divide H_kv names H_q and G; OUT = IN; an existing
OUT without --overwrite), generates and inspects with the converted checkpoints, and uptrains
one of them a few steps with --init-from (its accuracy before training is the converted
model's, the run keeps H_kv 2, its held-out cross-entropy falls below the converted model's,
conflicting architecture flags are refused).
"""
import json
import os
import re
import shutil
import subprocess
import sys

SMALL = ["--n-digits", "4", "--batch", "16", "--d-model", "16", "--layers", "1", "--threads", "1",
         "--no-progress", "--no-plot"]


def fail(msg):
    sys.exit(f"FAILED: {msg}")


def run(xgrad, args, want=0):
    r = subprocess.run([xgrad] + args, capture_output=True, text=True, timeout=600)
    if r.returncode != want:
        fail(f"xgrad {' '.join(args)}: exit {r.returncode}, expected {want}\nstdout: {r.stdout}\nstderr: {r.stderr}")
    if want != 0:
        lines = r.stderr.splitlines()
        if len(lines) != 1 or not lines[0].startswith("xgrad: "):
            fail(f"xgrad {' '.join(args)}: stderr is not one 'xgrad: ' line: {r.stderr!r}")
    return r


def result(stdout):
    m = re.search(r"^RESULT heldout_exact_match (\S+)$", stdout, re.M)
    if not m:
        fail(f"no RESULT line in {stdout!r}")
    return float(m.group(1))


def main():
    xgrad, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    p = lambda *a: os.path.join(work, *a)
    base = run(xgrad, ["train", "--steps", "60", "--heads", "4", "--out", p("run")] + SMALL)
    base_acc = result(base.stdout)
    model = p("run", "model.safetensors")

    reports = {}
    for g in (2, 1):
        out = p(f"g{g}.safetensors")
        r = run(xgrad, ["convert", "--kv-heads", str(g), model, out, "--json", p(f"g{g}.json")])
        with open(p(f"g{g}.json")) as f:
            j = json.load(f)
        reports[g] = j
        if j["command"] != "convert" or j["H_q"] != 4 or j["H_kv_from"] != 4 or j["H_kv_to"] != g:
            fail(f"--json heads: {j}")
        if j["heldout"]["sequences"] != 500 or j["heldout"]["positions"] != 500 * 4:
            fail(f"--json held-out sizes: {j['heldout']}")
        if abs(j["original"]["heldout_exact_match"] - base_acc) > 1e-9:
            fail(f"original exact match {j['original']['heldout_exact_match']} != the training run's {base_acc}")
        lg = j["logits"]
        if not (lg["max_abs_delta"] > 0 and 0 < lg["mean_abs_delta"] <= lg["max_abs_delta"] and lg["kl"] >= 0):
            fail(f"--json logits: {lg}")
        if abs(result(r.stdout) - j["converted"]["heldout_exact_match"]) > 1e-5:
            fail(f"text RESULT and --json disagree: {r.stdout}")
        if f"H_kv {g}" not in r.stdout or "KL(original || converted)" not in r.stdout:
            fail(f"text report: {r.stdout}")
        if j["parameters_to"] >= j["parameters_from"]:
            fail(f"fewer parameters expected: {j}")
        # --json - : the document alone on stdout.
        r = run(xgrad, ["convert", "--kv-heads", str(g), model, p(f"g{g}b.safetensors"), "--json", "-"])
        if json.loads(r.stdout)["converted"] != j["converted"]:
            fail("--json - differs from --json FILE")

    e = run(xgrad, ["convert", "--kv-heads", "3", model, p("g3.safetensors")], want=2)
    for word in ("--kv-heads 3", "H_q = 4", "G = 3", "convert --help"):
        if word not in e.stderr:
            fail(f"non-divisible G: {word!r} not in {e.stderr!r}")
    if os.path.exists(p("g3.safetensors")):
        fail("a failed convert wrote OUT")
    run(xgrad, ["convert", "--kv-heads", "2", model, model], want=2)
    before = open(p("g2.safetensors"), "rb").read()
    e = run(xgrad, ["convert", "--kv-heads", "2", model, p("g2.safetensors")], want=2)
    if "--overwrite" not in e.stderr or open(p("g2.safetensors"), "rb").read() != before:
        fail(f"existing OUT: {e.stderr!r}")
    run(xgrad, ["convert", "--kv-heads", "2", model, p("g2.safetensors"), "--overwrite"])

    run(xgrad, ["generate", "--checkpoint", p("g1.safetensors"), "--prompt", "4321|", "--max-new", "4"])
    r = run(xgrad, ["inspect", "--checkpoint", p("g2.safetensors"), "--json", "-"])
    if json.loads(r.stdout)["metadata"]["H_kv"] != "2":
        fail("inspect: H_kv of the converted checkpoint")

    up = run(xgrad, ["train", "--init-from", p("g2.safetensors"), "--steps", "20", "--out", p("up"),
                     "--no-progress", "--no-plot", "--threads", "1", "--batch", "16"])
    m = re.search(r"^initialised from .*: heldout_exact_match (\S+) before training$", up.stdout, re.M)
    if not m or abs(float(m.group(1)) - reports[2]["converted"]["heldout_exact_match"]) > 1e-5:
        fail(f"--init-from: accuracy before training is not the converted model's: {up.stdout}")
    if "heads 4/2 (q/kv)" not in up.stdout:
        fail(f"--init-from: not the converted configuration: {up.stdout}")
    result(up.stdout)
    # Uptraining recovers: the uptrained model's held-out cross-entropy (reported as the
    # "original" of a G = H_kv conversion, which copies the model: logits identical) is below
    # the converted model's.
    same = json.loads(run(xgrad, ["convert", "--kv-heads", "2", p("up", "model.safetensors"), p("same.safetensors"),
                                  "--json", "-"]).stdout)
    if same["logits"]["max_abs_delta"] != 0 or same["logits"]["kl"] != 0:
        fail(f"G = H_kv is not the identity: {same['logits']}")
    if not same["original"]["cross_entropy"] < reports[2]["converted"]["cross_entropy"]:
        fail(f"uptraining did not lower the held-out cross-entropy: {same['original']} vs {reports[2]['converted']}")
    e = run(xgrad, ["train", "--init-from", p("g2.safetensors"), "--heads", "2", "--out", p("up2")], want=2)
    if "--heads 2 conflicts with --init-from" not in e.stderr:
        fail(f"--init-from with --heads: {e.stderr!r}")
    print(f"convert ok: base {base_acc}, G=2 {reports[2]['converted']['heldout_exact_match']}, "
          f"G=1 {reports[1]['converted']['heldout_exact_match']}")


if __name__ == "__main__":
    main()
