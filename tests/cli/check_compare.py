#!/usr/bin/env python3
"""`xgrad compare` end to end (docs/cli.md, "xgrad compare"):

    check_compare.py XGRAD WORKDIR

Trains tiny real runs (two sort runs that differ in --lr only, and a `--task charlm` run,
the text task with the byte tokenizer, with validation losses and bits per byte that is
stopped and resumed), compares them with --json and --out, and
checks the JSON against the runs' log.csv files read here with Python's csv module (steps,
tokens seen from the flags given, wall time summed over the resumed sessions, final training
loss, final and best validation loss and step), the differing options, the table on stdout,
the PNG (a PNG of 1000 x 600 when gnuplot is installed) and its script; --json - alone on
stdout; no gnuplot on PATH; and a few refusals (one line, exit 2, nothing written).
"""
import csv
import json
import math
import os
import shutil
import sys

from check_cli_outputs import fail, png_size, run

SMALL = ["--d-model", "16", "--heads", "2", "--layers", "1", "--batch", "8", "--threads", "1",
         "--no-progress", "--no-plot"]


def refused(xgrad, args, words):
    """A usage error: exit 2 and one line 'xgrad: ...' holding `words`."""
    r = run(xgrad, args, want=2)
    lines = r.stderr.splitlines()
    if len(lines) != 1 or not lines[0].startswith("xgrad: ") or words.lower() not in lines[0].lower():
        fail(f"xgrad {' '.join(args)}: stderr is not one 'xgrad: ' line with '{words}': {r.stderr!r}")


def expected(folder, tokens_per_step):
    """The figures of one run, from its log.csv alone."""
    with open(os.path.join(folder, "log.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    steps = int(rows[-1]["step"])
    if [int(r["step"]) for r in rows] != list(range(1, steps + 1)):
        fail(f"{folder}/log.csv: steps are not 1..{steps}")
    # A session starts where the clock restarts (elapsed_s falls) or at a step whose
    # tokens_per_s * elapsed_s is one step's tokens (the first step of a session).
    wall, sessions = 0.0, 0
    for i, r in enumerate(rows):
        e, tps = float(r["elapsed_s"]), float(r["tokens_per_s"])
        start = i == 0 or e < float(rows[i - 1]["elapsed_s"]) or abs(tps * e / tokens_per_step - 1) < 0.25
        if start:
            sessions += 1
        if i + 1 == len(rows) or (float(rows[i + 1]["elapsed_s"]) < e or
                                  abs(float(rows[i + 1]["tokens_per_s"]) * float(rows[i + 1]["elapsed_s"]) /
                                      tokens_per_step - 1) < 0.25):
            wall += e  # the last row of a session
    tail = max(1, math.ceil(len(rows) * 0.05))
    vals = [(int(r["step"]), float(r["val_loss"])) for r in rows if r.get("val_loss")]
    best = min(vals, key=lambda v: v[1]) if vals else None  # min keeps the first of equal ones
    return {
        "steps": steps,
        "tokens": steps * tokens_per_step,
        "sessions": sessions,
        "wall_s": wall,
        "final_train_loss": sum(float(r["loss"]) for r in rows[-tail:]) / tail,
        "final_val_loss": vals[-1][1] if vals else None,
        "best_val_loss": best[1] if best else None,
        "best_val_step": best[0] if best else None,
        # Bits per byte: the last logged, and the one in the best validation loss's row.
        "final_val_bpb": next((float(r["val_bpb"]) for r in reversed(rows) if r.get("val_bpb")), None),
        "best_val_bpb": next((float(r["val_bpb"]) for r in rows if best and r.get("val_bpb") and
                              int(r["step"]) == best[0]), None),
    }


def close(a, b):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= 1e-12 * max(1.0, abs(b))


def main():
    xgrad, work = os.path.abspath(sys.argv[1]), sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.chdir(work)
    sort = ["train", "--task", "sort", "--steps", "20", "--n-digits", "4"] + SMALL
    run(xgrad, sort + ["--out", "A"])
    run(xgrad, sort + ["--lr", "0.01", "--out", "B"])
    with open("text.txt", "w") as f:
        f.write("the quick brown fox jumps over the lazy dog.\n" * 400)  # text: at least two documents
    charlm = ["train", "--task", "charlm", "--text", "text.txt", "--context", "16", "--steps", "40",
              "--eval-every", "10"] + SMALL
    run(xgrad, charlm + ["--stop-at", "20", "--out", os.path.join("lm", "A")])
    run(xgrad, ["train", "--resume", os.path.join("lm", "A"), "--no-progress", "--no-plot", "--threads", "1"])
    tokens_per_step = {"A": 8 * 2 * 4, "B": 8 * 2 * 4, "lm/A": 8 * 16}  # batch * 2 digits; batch * context

    # Two runs that differ in --lr alone.
    r = run(xgrad, ["compare", "A", "B", "--json", "ab.json"])
    with open("ab.json") as f:
        ab = json.load(f)
    if ab["differing_options"] != ["lr"]:
        fail(f"A and B differ in lr only, got {ab['differing_options']}")
    lrs = [float(x["options"]["lr"]) for x in ab["runs"]]
    if not (close(lrs[0], 0.003) and close(lrs[1], 0.01)):
        fail(f"lr options {lrs}")
    if "options that differ:" not in r.stdout or not any(l.split()[:3] == ["lr", "0.003", "0.01"] for l in r.stdout.splitlines()):
        fail(f"the table does not list lr 0.003 0.01:\n{r.stdout}")
    if ab["picture"] is not None:
        fail("no --out: the picture is null")

    # Three runs, by tokens seen; the names A clash: labels A/lm-A path suffixes.
    r = run(xgrad, ["compare", "A", "B", os.path.join("lm", "A"), "--json", "cmp.json", "--out", "cmp.png", "--x", "tokens"])
    with open("cmp.json") as f:
        j = json.load(f)
    if j["command"] != "compare" or j["x"] != "tokens":
        fail(f"command/x: {j['command']} {j['x']}")
    labels = [x["label"] for x in j["runs"]]
    want_labels = [os.path.join(os.path.basename(work), "A"), "B", "lm/A"]
    if labels != want_labels:
        fail(f"labels {labels}, expected {want_labels}")
    for x, folder in zip(j["runs"], ["A", "B", "lm/A"]):
        want = expected(folder, tokens_per_step[folder])
        for key, value in want.items():
            got = x[key]
            ok = close(got, value) if isinstance(value, float) or value is None else got == value
            if not ok:
                fail(f"{folder}: {key} = {got}, log.csv says {value}")
        with open(os.path.join(folder, "run_id.txt")) as f:
            if x["run_id"] != f.read().strip():
                fail(f"{folder}: run_id {x['run_id']}")
        if x["dir"] != folder:
            fail(f"{folder}: dir {x['dir']}")
        if x["label"] not in r.stdout:
            fail(f"the table lacks {x['label']}")
    lm = j["runs"][2]
    if lm["sessions"] != 2 or lm["best_val_loss"] is None or lm["final_val_bpb"] is None or \
            lm["options"]["task"] != "text" or lm["options"].get("tokenizer", "bytes") != "bytes":
        fail(f"lm/A: a resumed --task charlm run (text, bytes) with validation losses and bits per byte: {lm}")
    if not {"lr", "task", "context"} <= set(j["differing_options"]):
        fail(f"differing options {j['differing_options']}")
    if not os.path.isfile("cmp.gp") or "tokens seen" not in open("cmp.gp").read():
        fail("cmp.gp missing or not by tokens seen")
    pic = j["picture"]
    if shutil.which("gnuplot"):
        if png_size("cmp.png") != (1000, 600) or not pic["drawn"] or (pic["width"], pic["height"]) != (1000, 600):
            fail(f"cmp.png: {png_size('cmp.png')} {pic}")
        if "wrote cmp.png (1000 x 600; script cmp.gp)" not in r.stdout:
            fail(f"no 'wrote' line:\n{r.stdout}")
    elif pic["drawn"]:
        fail("drawn without gnuplot")

    # --json -: the document alone on stdout.
    r = run(xgrad, ["compare", "A", "B", "--json", "-"])
    if json.loads(r.stdout)["runs"] != ab["runs"]:
        fail("--json - differs from --json FILE")

    # No gnuplot on PATH: a warning, the script, no PNG, exit 0.
    os.makedirs("empty_bin")
    env = dict(os.environ, PATH=os.path.abspath("empty_bin"))
    r = run(xgrad, ["compare", "A", "B", "--out", "nognu.png", "--json", "nognu.json"], env=env)
    if "xgrad: warning: gnuplot not found" not in r.stderr or os.path.exists("nognu.png") or not os.path.isfile("nognu.gp"):
        fail(f"without gnuplot: {r.stderr!r}")
    with open("nognu.json") as f:
        if json.load(f)["picture"]["drawn"] is not False:
            fail("without gnuplot the picture is not drawn")

    # Refusals: one line, exit 2, no file written or changed.
    before = {p: open(p, "rb").read() for p in ["A/log.csv", "A/loss.gp"] if os.path.exists(p)}
    for args, words in [(["A", "A"], "same folder"),
                        (["A", "./A/"], "same folder"),
                        (["A", "missing"], "does not exist"),
                        (["A", "text.txt"], "is a file"),
                        (["A", "B", "--out", "A/log.csv"], "name the same file"),
                        (["A", "B", "--out", "A/loss.png"], "name the same file"),
                        (["A", "B", "--json", "B/run_id.txt"], "name the same file"),
                        (["A", "B", "--x", "time"], "--x"),
                        ([], "RUN is required")]:
        refused(xgrad, ["compare"] + args, words)
    shutil.copytree("A", "A_copy")
    refused(xgrad, ["compare", "A", "A_copy"], "same run")
    for p, data in before.items():
        if open(p, "rb").read() != data:
            fail(f"{p} changed")
    print("compare: OK")


if __name__ == "__main__":
    main()
