#!/usr/bin/env python3
"""What the xgrad program writes where (docs/cli.md), checked from the outside:

    check_cli_outputs.py XGRAD WORKDIR

- train: results on stdout (the RESULT line, no progress lines), progress on stderr;
- generate --json / inspect --json: valid JSON with the documented keys, values that agree
  with the text output and with each other (softmax of the logits, causal attention rows);
  `--json -` puts the JSON document alone on stdout;
- a sliding-window model's attention JSON and map mask the cells outside the window;
- pictures: the PNGs are valid and of the size reported, their .gp scripts carry the title,
  axis names, token labels, colour scale and masked-cell colour;
- without gnuplot on PATH every picture is skipped with one warning line and the command
  succeeds; a gnuplot that fails turns a finished training run into a warning, not a failure,
  and makes generate --attention-map fail with one line naming gnuplot.
"""
import json
import math
import os
import re
import shutil
import stat
import struct
import subprocess
import sys

SMALL = ["--n-digits", "4", "--batch", "8", "--d-model", "16", "--heads", "2", "--layers", "1", "--threads", "1"]
MASKED = "#9e9e9e"


def fail(msg):
    sys.exit(f"FAILED: {msg}")


def run(xgrad, args, env=None, want=0, cwd=None):
    r = subprocess.run([xgrad] + args, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    if r.returncode != want:
        fail(f"xgrad {' '.join(args)}: exit {r.returncode}, expected {want}\nstdout: {r.stdout}\nstderr: {r.stderr}")
    return r


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        fail(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def need(cond, msg):
    if not cond:
        fail(msg)


def keys(obj, names, where):
    missing = [k for k in names if k not in obj]
    need(not missing, f"{where}: missing keys {missing} (has {sorted(obj)})")


def check_train(xgrad, work):
    out = os.path.join(work, "run")
    r = run(xgrad, ["train", "--steps", "40", "--out", out] + SMALL)  # progress on
    need("RESULT heldout_exact_match" in r.stdout, "train: no RESULT line on stdout")
    need("step 40/40 |" in r.stderr, f"train: no progress line on stderr: {r.stderr!r}")
    need("step " not in r.stdout and "ETA" not in r.stdout, f"train: progress on stdout: {r.stdout!r}")
    need("RESULT" not in r.stderr, "train: the RESULT line went to stderr")
    # The second line names the kernels chosen on this CPU (issue 34: the choice in the run line).
    lines = r.stdout.split("\n")
    need(len(lines) > 1 and lines[1].startswith("kernels: float32 GEMM ") and len(lines[1]) > len("kernels: float32 GEMM "),
         f"train: no kernels line after the run line: {r.stdout!r}")
    need(f"{out}/loss.png" in r.stdout, "train: stdout does not list loss.png")
    need(png_size(os.path.join(out, "loss.png")) == (900, 500), "loss.png is not 900 x 500")
    gp = read(os.path.join(out, "loss.gp"))
    need('plot "log.csv" using 1:3' in gp and "set ylabel" in gp, f"loss.gp: {gp}")
    r = run(xgrad, ["train", "--steps", "40", "--out", out, "--overwrite", "--no-progress"] + SMALL)
    need(r.stderr == "", f"train --no-progress: stderr not empty: {r.stderr!r}")
    print("train: results on stdout, progress on stderr, loss.png drawn")
    return os.path.join(out, "model.safetensors")


def check_samples_and_stops(xgrad, model, prompt, greedy):
    """--num-samples, --prompt-ids and --stop against the greedy generation `greedy` (JSON of
    --max-new 50): samples separated by a line of dashes, sample 0 the one a single sample gives,
    ids the same prompt as its text, and a stop string cutting the text where it starts."""
    base = ["generate", "--checkpoint", model, "--max-new", "12", "--temperature", "1", "--seed", "3"]
    one = run(xgrad, base + ["--prompt", prompt]).stdout
    three = run(xgrad, base + ["--prompt", prompt, "--num-samples", "3"]).stdout.split("\n---------------\n")
    need(len(three) == 3 and three[0] == one.rstrip("\n"), f"--num-samples 3: {three!r} vs {one!r}")
    need(len(set(three)) > 1, f"--num-samples 3 drew the same sample three times: {three!r}")
    j = json.loads(run(xgrad, base + ["--prompt", prompt, "--num-samples", "3", "--json", "-"]).stdout)
    need([s["line"] for s in j["samples"]] == [t.rstrip("\n") for t in three] and j["line"] == j["samples"][0]["line"],
         f"--json samples: {j['samples']}")
    ids = ",".join(str(t["id"]) for t in greedy["prompt"]["tokens"])
    by_ids = json.loads(run(xgrad, base + ["--prompt-ids", ids, "--json", "-"]).stdout)
    need(by_ids["line"] == one.rstrip("\n") and by_ids["prompt"]["text"] == prompt,
         f"--prompt-ids {ids}: {by_ids['line']!r} vs {one!r}")
    text = greedy["generated"]["text"]
    stop = text[3:5]  # two characters from the fourth on: the text is cut where they first appear
    j = json.loads(run(xgrad, ["generate", "--checkpoint", model, "--prompt", prompt, "--max-new", "50", "--json", "-",
                               "--stop", stop, "--stop", "never-there"]).stdout)
    cut = text.index(stop)
    need(j["generated"]["text"] == text[:cut] and j["generated"]["stopped_by"] == "stop_string" and
         j["generated"]["count"] == cut + len(stop) and j["sampling"]["stop"] == [stop, "never-there"],
         f"--stop {stop!r} in {text!r}: {j['generated']}")
    print("generate: --num-samples, --prompt-ids and --stop")


def check_generate(xgrad, work, model):
    prompt = "4312|"
    text = run(xgrad, ["generate", "--checkpoint", model, "--prompt", prompt, "--max-new", "4"]).stdout
    line = text.split("\n")[0]
    gpath, apath = os.path.join(work, "g.json"), os.path.join(work, "attention.png")
    r = run(xgrad, ["generate", "--checkpoint", model, "--prompt", prompt, "--max-new", "4", "--json", gpath,
                    "--json-top-k", "11", "--json-attention", "--layer", "0", "--head", "1", "--attention-map", apath])
    need(r.stdout.split("\n")[0] == line, f"generate: text output changed with --json: {r.stdout!r} vs {line!r}")
    j = json.loads(read(gpath))
    keys(j, ["command", "xgrad_version", "checkpoint", "model", "sampling", "prompt", "generated", "line", "steps",
             "top_k_per_step", "attention", "attention_map"], "generate JSON")
    need(j["command"] == "generate" and j["line"] == line, f"generate JSON: line {j['line']!r} vs {line!r}")
    keys(j["model"], ["kind", "task", "context", "vocab_size", "layers", "heads", "kv_heads"], "generate JSON model")
    keys(j["sampling"], ["mode", "temperature", "top_k", "seed", "kv_cache", "max_new", "max_new_effective",
                         "stop_token"], "generate JSON sampling")
    need(j["sampling"]["mode"] == "greedy" and j["sampling"]["max_new"] == 4, f"sampling: {j['sampling']}")
    need(j["prompt"]["text"] == prompt and "".join(t["text"] for t in j["prompt"]["tokens"]) == prompt,
         f"prompt: {j['prompt']}")
    gen = j["generated"]
    need(prompt + gen["text"] == line, f"generated text {gen['text']!r} does not continue the line {line!r}")
    need(gen["count"] == len(gen["tokens"]) == len(j["steps"]) == 4, f"generated: {gen}")
    need("".join(t["text"] for t in gen["tokens"]) == gen["text"], "generated tokens do not spell the text")
    V = j["model"]["vocab_size"]
    need(j["top_k_per_step"] == min(11, V), f"top_k_per_step {j['top_k_per_step']}")
    for s, step in enumerate(j["steps"]):
        keys(step, ["step", "token", "logit", "prob", "rank", "top"], f"step {s}")
        top = step["top"]
        logits = [t["logit"] for t in top]
        need(logits == sorted(logits, reverse=True), f"step {s}: top not ordered by logit")
        # All V tokens are listed: the probabilities are the softmax of the logits.
        need(len(top) == V, f"step {s}: {len(top)} entries, vocabulary {V}")
        hi = max(logits)
        z = sum(math.exp(l - hi) for l in logits)
        for t in top:
            need(abs(t["prob"] - math.exp(t["logit"] - hi) / z) < 1e-9, f"step {s}: prob is not softmax(logit)")
        need(step["token"]["id"] == top[0]["id"] and step["rank"] == 0, f"step {s}: greedy did not take the top token")
        need(step["token"] == gen["tokens"][s], f"step {s}: token differs from generated.tokens")
    att = j["attention"]
    keys(att, ["layer", "head", "kv_head", "queries", "keys", "tokens", "weights", "allowed"], "attention")
    T = len(prompt) + gen["count"]
    need(att["queries"] == att["keys"] == T == len(att["weights"]) == len(att["tokens"]), f"attention is not {T} x {T}")
    need(att["layer"] == 0 and att["head"] == 1, "attention layer/head")
    for q, (row, vis) in enumerate(zip(att["weights"], att["allowed"])):
        need(vis == [k <= q for k in range(T)], f"attention row {q}: allowed is not causal")
        need(all(w == 0.0 for w, v in zip(row, vis) if not v), f"attention row {q}: weight on a masked key")
        need(abs(sum(row) - 1.0) < 1e-5, f"attention row {q} sums to {sum(row)}")
    # The picture: what JSON reports, a valid PNG, a script with title, axes, labels, colours.
    pic = j["attention_map"]
    need(pic["drawn"] and pic["png"] == apath and pic["script"] == apath[:-4] + ".gp", f"attention_map: {pic}")
    need(png_size(apath) == (pic["width"], pic["height"]), "attention.png size differs from the JSON")
    need(pic["width"] >= 560 and pic["height"] >= 400, f"attention.png is too small: {pic}")
    gp = read(pic["script"])
    for want in ["set title \"attention weights: layer 0, query head 1", 'set xlabel "key position"',
                 'set ylabel "query position"', 'set cblabel "attention weight"', "set cbrange [0:1]",
                 f"fillcolor rgb '{MASKED}'", '"masked (not allowed)"',
                 'set xtics out nomirror ("4" 0, "3" 1, "1" 2, "2" 3, "|" 4',
                 'set ytics out nomirror ("4" 0, "3" 1, "1" 2, "2" 3, "|" 4']:
        need(want in gp, f"attention.gp lacks {want!r}")
    # --json -: the document alone on stdout, the same generation.
    r = run(xgrad, ["generate", "--checkpoint", model, "--prompt", prompt, "--max-new", "4", "--json", "-"])
    j2 = json.loads(r.stdout)  # fails if anything else is on stdout
    need(j2["line"] == line and j2["steps"][0]["top"] == j["steps"][0]["top"][:5], "--json - differs")
    # Past the context window: cropping (nn/generate.hpp; the logits are tested in tests/nn), all 50
    # tokens, no warning, and the attention covers the last `context` tokens.
    r = run(xgrad, ["generate", "--checkpoint", model, "--prompt", prompt, "--max-new", "50", "--json", "-",
                    "--json-attention"])
    j3 = json.loads(r.stdout)
    C = j3["model"]["context"]
    need(j3["generated"]["stopped_by"] == "max_new" and j3["generated"]["count"] == 50 and
         j3["sampling"]["max_new_effective"] == 50 and len(prompt) + 50 > C,
         f"max-new past the window: {j3['generated']['stopped_by']}, {j3['sampling']}, context {C}")
    need(j3["attention"]["queries"] == C, f"attention past the window: {j3['attention']['queries']} queries, context {C}")
    need("warning" not in r.stderr, f"stderr: {r.stderr!r}")
    # The first tokens are those of a generation that stays inside the context.
    need([t["id"] for t in j3["generated"]["tokens"][:4]] == [t["id"] for t in gen["tokens"]],
         "cropping changed the tokens inside the context")
    check_samples_and_stops(xgrad, model, prompt, j3)
    print("generate: --json consistent with the text output; attention map and script complete")


def check_window_attention(xgrad, work):
    """A sliding-window model: the JSON's `allowed` and the picture's masked cells are the
    window's visibility (key k seen by query q iff q - W < k <= q), not the plain causal mask."""
    W = 3
    out = os.path.join(work, "windowed")
    run(xgrad, ["train", "--steps", "20", "--window", str(W), "--out", out, "--no-progress", "--no-plot"] + SMALL)
    apath = os.path.join(work, "window_attention.png")
    for layer, head in ((0, 0), (0, 1)):
        r = run(xgrad, ["generate", "--checkpoint", os.path.join(out, "model.safetensors"), "--prompt", "4312|",
                        "--max-new", "4", "--json", "-", "--json-attention", "--layer", str(layer), "--head", str(head),
                        "--attention-map", apath, "--overwrite"])
        att = json.loads(r.stdout)["attention"]
        T = att["queries"]
        need(T == 9, f"windowed attention: {T} queries")
        for q, (row, vis) in enumerate(zip(att["weights"], att["allowed"])):
            need(vis == [q - W < k <= q for k in range(T)],
                 f"windowed attention row {q}: allowed {vis} is not the window of {W}")
            need(all(w == 0.0 for w, v in zip(row, vis) if not v), f"windowed attention row {q}: weight outside")
            need(abs(sum(row) - 1.0) < 1e-5, f"windowed attention row {q} sums to {sum(row)}")
        # The picture's data: NaN (drawn masked grey) exactly where not allowed.
        gp = read(apath[:-4] + ".gp")
        block = gp.split("$weights << EOD\n", 1)[1].split("EOD\n", 1)[0].strip("\n").split("\n")
        need(len(block) == T, f"window_attention.gp: {len(block)} data rows")
        for q, line in enumerate(block):
            cells = line.split(" ")
            need([c == "NaN" for c in cells] == [not (q - W < k <= q) for k in range(T)],
                 f"window_attention.gp row {q}: masked cells {cells} are not those outside the window of {W}")
    print("generate on a windowed model: attention JSON and picture mask the cells outside the window")


def check_inspect(xgrad, work, model):
    text = run(xgrad, ["inspect", "--checkpoint", model]).stdout
    ipath = os.path.join(work, "i.json")
    r = run(xgrad, ["inspect", "--checkpoint", model, "--json", ipath])
    need(r.stdout == text, "inspect: the text output changed with --json FILE")
    j = json.loads(read(ipath))
    keys(j, ["command", "xgrad_version", "checkpoint", "kind", "task", "metadata", "description", "config",
             "vocabulary", "parameters", "parameter_count", "cost"], "inspect JSON")
    # The description: one entry per model schema row the model has, each value the metadata's.
    for d in j["description"]:
        keys(d, ["key", "value", "option", "help"], "inspect JSON description")
        need(j["metadata"].get(d["key"]) == d["value"], f"description {d['key']}: {d['value']!r} vs the metadata's")
    described = {d["key"]: d for d in j["description"]}
    need(described.get("d_model", {}).get("option") == "d_model" and described.get("H_q", {}).get("option") == "heads",
         f"description names the options: {sorted(described)}")
    keys(j["config"], ["vocab_size", "context", "d_model", "heads", "kv_heads", "d_h", "layers", "encoder_layers",
                       "d_ff", "dropout", "dtype"], "inspect JSON config")
    c = j["config"]
    need(c["d_model"] == 16 and c["heads"] == 2 and c["layers"] == 1 and c["d_h"] == 8, f"config: {c}")
    need(len(j["vocabulary"]) == c["vocab_size"], "vocabulary size")
    lines = text.split("\n")
    # The parameter table: every row's name, shape and count, and the total.
    for p in j["parameters"]:
        keys(p, ["name", "shape", "count", "dtype"], "parameter")
        need(math.prod(p["shape"]) == p["count"], f"{p['name']}: count is not the product of the shape")
        row = [l.split() for l in lines if l.split()[:1] == [p["name"]]]
        need(row and row[0][-1] == str(p["count"]), f"{p['name']}: not in the text table with count {p['count']}")
    need(j["parameter_count"] == sum(p["count"] for p in j["parameters"]), "parameter_count is not the sum")
    need(f"total" in text and any(l.split()[:1] == ["total"] and l.split()[-1] == str(j["parameter_count"])
                                  for l in lines), "the text total differs")
    # The cost model: the text's figures, term by term.
    cost = j["cost"]
    names = {"Q projection": "q_proj", "K projection": "k_proj", "V projection": "v_proj",
             "output projection": "o_proj", "Q K^T": "scores", "A V": "weighted_sum"}
    for label, key in names.items():
        row = [l for l in lines if l.strip().startswith(label + " ")]
        need(row, f"inspect text lacks {label}")
        value = float(row[0].strip()[len(label):].split()[0])
        need(abs(value - cost["flops_per_token"][key]) <= 1e-5 * abs(value), f"{label}: {value} vs {cost}")
        need(abs(cost["flops_per_layer"][key] / cost["T"] - cost["flops_per_token"][key]) < 1e-9, f"{key} per token")
    need(cost["T"] == c["context"], "cost T is not the context")
    need(f"per token           {cost['kv_cache']['bytes_per_token']} bytes" in text, "KV cache bytes per token")
    need(f"at full context     {cost['kv_cache']['bytes_at_context']} bytes" in text, "KV cache bytes at context")
    need(f"= {cost['attention_weights_bytes_per_layer']} bytes per layer" in text, "weight bytes")
    r = run(xgrad, ["inspect", "--checkpoint", model, "--json", "-"])
    need(json.loads(r.stdout) == j, "inspect --json - differs from --json FILE")
    print("inspect: --json consistent with the text output")


def check_visibility(xgrad, work):
    out = os.path.join(work, "vis")
    r = run(xgrad, ["visibility", "--out", out])
    for name, title, yticks in [("causal", "causal visibility: 8 queries x 8 keys", '("0" 0, "1" 1'),
                                ("causal_suffix", "causal visibility of 3 new queries", '("5" 0, "6" 1, "7" 2)'),
                                ("documents", "document-causal visibility", '("0A" 0, "1A" 1, "2A" 2, "3B" 3')]:
        w, h = png_size(os.path.join(out, name + ".png"))
        need(f"{out}/{name}.png ({w}x{h})" in r.stdout, f"{name}.png size not reported: {r.stdout}")
        need(400 <= h <= 2000 and 560 <= w <= 2000, f"{name}.png: implausible size {w} x {h}")
        gp = read(os.path.join(out, name + ".gp"))
        for want in [f'set title "{title}', 'set xlabel "key position', 'set ylabel "query position',
                     f"set ytics out nomirror {yticks}", '"allowed"', '"masked (forbidden)"',
                     f"fillcolor rgb '{MASKED}'"]:
            need(want in gp, f"{name}.gp lacks {want!r}")
    print("visibility: three PNGs with complete scripts")


def fake_path(work, name, script):
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    if script:
        p = os.path.join(d, "gnuplot")
        with open(p, "w") as f:
            f.write(script)
        os.chmod(p, stat.S_IRWXU)
    return dict(os.environ, PATH=d)


def check_without_gnuplot(xgrad, work, model):
    env = fake_path(work, "nognuplot", None)
    out = os.path.join(work, "run_nognuplot")
    r = run(xgrad, ["train", "--steps", "3", "--out", out, "--no-progress"] + SMALL, env=env)
    need("RESULT" in r.stdout, "train without gnuplot: no RESULT")
    err = r.stderr.strip("\n").split("\n")
    need(len(err) == 1 and err[0].startswith("xgrad: warning: gnuplot not found") and "loss.png" in err[0],
         f"train without gnuplot: stderr {r.stderr!r}")
    need(not os.path.exists(os.path.join(out, "loss.png")) and os.path.exists(os.path.join(out, "loss.gp")),
         "train without gnuplot: loss.png drawn or loss.gp missing")
    vis = os.path.join(work, "vis_nognuplot")
    r = run(xgrad, ["visibility", "--out", vis], env=env)
    err = r.stderr.strip("\n").split("\n")
    need(len(err) == 1 and "gnuplot not found" in err[0], f"visibility without gnuplot: stderr {r.stderr!r}")
    need(sorted(os.listdir(vis)) == ["causal.gp", "causal_suffix.gp", "documents.gp"], f"{os.listdir(vis)}")
    png = os.path.join(work, "a_nognuplot.png")
    r = run(xgrad, ["generate", "--checkpoint", model, "--prompt", "4312|", "--max-new", "4", "--attention-map",
                    png], env=env)
    need(r.stdout.startswith("4312|") and not os.path.exists(png), "generate without gnuplot")
    # Besides the tok/s line every generation prints, one warning.
    warned = [ln for ln in r.stderr.strip().split("\n") if not re.match(r"xgrad: \d+ tokens in [0-9.]+ s \(", ln)]
    need(len(warned) == 1 and "gnuplot not found" in r.stderr, f"stderr {r.stderr!r}")
    print("without gnuplot: pictures skipped with one warning, commands succeed")

    env = fake_path(work, "badgnuplot", "#!/bin/sh\necho 'gnuplot: cannot draw today' >&2\nexit 1\n")
    r = run(xgrad, ["train", "--steps", "3", "--out", out, "--overwrite", "--no-progress"] + SMALL, env=env)
    need("RESULT" in r.stdout and "warning: no loss curve" in r.stderr and "cannot draw today" in r.stderr,
         f"train with a failing gnuplot: {r.stderr!r}")
    r = run(xgrad, ["generate", "--checkpoint", model, "--prompt", "4312|", "--max-new", "4", "--attention-map",
                    png, "--overwrite"], env=env, want=1)
    err = r.stderr.strip("\n").split("\n")
    need(len(err) == 1 and err[0].startswith("xgrad: ") and "gnuplot" in err[0] and "cannot draw today" in err[0],
         f"generate with a failing gnuplot: {r.stderr!r}")
    print("failing gnuplot: training still succeeds (warning); generate --attention-map fails naming gnuplot")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    xgrad, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model = check_train(xgrad, work)
    check_generate(xgrad, work, model)
    check_window_attention(xgrad, work)
    check_inspect(xgrad, work, model)
    check_visibility(xgrad, work)
    check_without_gnuplot(xgrad, work, model)
    print("cli outputs OK")


if __name__ == "__main__":
    main()
