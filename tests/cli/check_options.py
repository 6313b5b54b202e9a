#!/usr/bin/env python3
"""The option rules every command shares (docs/cli.md, "Options every command shares"):

    check_options.py XGRAD WORKDIR

- `--help` of every command (and of `xgrad` itself) shows its defaults and an example;
  train's lists the defaults that differ by task.
- The old spellings of renamed flags still work, with one deprecation line on stderr
  (`xgrad: --old is deprecated, use --new`), and mean what the new spelling means.
- `--json -` on every command that has --json: a JSON document (JSON lines for
  `tokenizer encode`) alone on stdout.
- `--overwrite`: an output that exists is refused (exit 2, one line, the file keeps its
  bytes) unless --overwrite is given, on every command that writes outputs.
- A run folder is accepted where a checkpoint is, meaning its final model.safetensors.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

from check_cli_outputs import fail, need, run

SMALL = ["--batch", "8", "--d-model", "16", "--heads", "2", "--layers", "1", "--threads", "1", "--no-progress",
         "--no-plot"]

COMMANDS = [[], ["demo"], ["gradcheck"], ["train"], ["generate"], ["inspect"], ["visibility"], ["convert"],
            ["compare"], ["eval"], ["report"], ["tokenizer"], ["tokenizer", "train"], ["tokenizer", "encode"],
            ["tokenizer", "decode"], ["import"], ["import", "llama2c"], ["export"], ["export", "llama2c"]]


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def check_help(xgrad):
    for cmd in COMMANDS:
        r = run(xgrad, cmd + ["--help"])
        need("Example:\n  xgrad" in r.stdout, f"xgrad {' '.join(cmd)} --help: no example line\n{r.stdout}")
        need("default" in r.stdout, f"xgrad {' '.join(cmd)} --help: says nothing of defaults\n{r.stdout}")
    t = run(xgrad, ["train", "--help"]).stdout
    for line in ("--task sort: --steps 1000, --lr 0.003", "--task reverse: --steps 1500, --lr 0.003",
                 "--task text (and charlm): --steps 2000, --batch 32, --lr 0.005", "--arch llama: --pos rope"):
        need(line in t, f"train --help lacks the per-task defaults line '{line}'\n{t}")
    print(f"--help: {len(COMMANDS)} commands show their defaults and an example")


def deprecated(xgrad, args, old, new, cwd=None):
    """Runs args (exit 0): stderr holds exactly one deprecation line naming old and new."""
    r = run(xgrad, args, cwd=cwd)
    lines = [l for l in r.stderr.splitlines() if "deprecated" in l]
    need(lines == [f"xgrad: {old} is deprecated, use {new}"], f"xgrad {' '.join(args)}: deprecation lines {lines}")
    return r


def config(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


def check_deprecated(xgrad, w):
    # --digits: the old spelling of --n-digits (JSON n_digits), also as --digits=N.
    deprecated(xgrad, ["train", "--steps", "2", "--digits", "3", "--out", os.path.join(w, "d1")] + SMALL,
               "--digits", "--n-digits")
    need(config(os.path.join(w, "d1"))["n_digits"] == 3, "--digits 3 did not set n_digits")
    deprecated(xgrad, ["train", "--steps", "2", "--digits=5", "--out", os.path.join(w, "d2")] + SMALL,
               "--digits", "--n-digits")
    need(config(os.path.join(w, "d2"))["n_digits"] == 5, "--digits=5 did not set n_digits")
    r = run(xgrad, ["train", "--steps", "2", "--n-digits", "5", "--out", os.path.join(w, "d3")] + SMALL)
    need("deprecated" not in r.stderr, f"--n-digits printed a deprecation line: {r.stderr!r}")
    # --untied-classifier: the old spelling of --no-tie-embeddings (JSON tie_embeddings).
    llama = ["train", "--arch", "llama", "--steps", "2", "--n-digits", "4", "--multiple-of", "16"] + SMALL
    deprecated(xgrad, llama + ["--untied-classifier", "--out", os.path.join(w, "u1")], "--untied-classifier",
               "--no-tie-embeddings")
    run(xgrad, llama + ["--no-tie-embeddings", "--out", os.path.join(w, "u2")])
    run(xgrad, llama + ["--out", os.path.join(w, "u3")])
    need(config(os.path.join(w, "u1"))["tie_embeddings"] is False, "--untied-classifier: tie_embeddings not false")
    need(config(os.path.join(w, "u2"))["tie_embeddings"] is False, "--no-tie-embeddings: tie_embeddings not false")
    need(config(os.path.join(w, "u3"))["tie_embeddings"] is True, "llama's default: tie_embeddings true")
    need(digest(os.path.join(w, "u1", "model.safetensors")) == digest(os.path.join(w, "u2", "model.safetensors")),
         "--untied-classifier and --no-tie-embeddings trained different models")
    # tokenizer encode --text S: the old spelling of --string S (--text is a path everywhere).
    r = deprecated(xgrad, ["tokenizer", "encode", "--tokenizer", "bytes", "--text", "abc"], "--text", "--string")
    need(r.stdout == "97 98 99\n", f"encode --text abc: {r.stdout!r}")
    need(run(xgrad, ["tokenizer", "encode", "--tokenizer", "bytes", "--string", "abc"]).stdout == "97 98 99\n",
         "encode --string abc")
    # inspect FILE: the old spelling of inspect --checkpoint FILE.
    model = os.path.join(w, "d1", "model.safetensors")
    r = run(xgrad, ["inspect", model])
    need(r.stderr == "xgrad: the FILE operand of xgrad inspect is deprecated, use --checkpoint FILE\n",
         f"inspect FILE: stderr {r.stderr!r}")
    need(r.stdout == run(xgrad, ["inspect", "--checkpoint", model]).stdout, "inspect FILE and --checkpoint FILE differ")
    print("deprecated spellings: --digits, --untied-classifier, encode --text, inspect FILE work with one line each")


def json_alone(xgrad, args, lines=False):
    r = run(xgrad, args)
    try:
        if lines:
            docs = [json.loads(l) for l in r.stdout.splitlines()]
            need(len(docs) >= 1, "no JSON line")
            return docs
        return json.loads(r.stdout)
    except json.JSONDecodeError as e:
        fail(f"xgrad {' '.join(args)}: stdout is not JSON alone ({e}): {r.stdout[:300]!r}")


def check_json_stdout(xgrad, w, model, text_run, text):
    j = json_alone(xgrad, ["generate", "--checkpoint", model, "--prompt", "123|", "--max-new", "2", "--json", "-"])
    need(j["command"] == "generate", "generate --json -")
    j = json_alone(xgrad, ["inspect", "--checkpoint", model, "--json", "-"])
    need(j["command"] == "inspect", "inspect --json -")
    j = json_alone(xgrad, ["eval", "--checkpoint", text_run, "--text", text, "--json", "-", "--threads", "1"])
    need(j["tokens"] > 0, "eval --json -")
    j = json_alone(xgrad, ["convert", "--kv-heads", "1", model, os.path.join(w, "c.safetensors"), "--json", "-",
                           "--heldout", "20"])
    need(j["command"] == "convert" and j["H_kv_to"] == 1, "convert --json -")
    j = json_alone(xgrad, ["compare", os.path.join(w, "d1"), os.path.join(w, "d2"), "--json", "-"])
    need(j["command"] == "compare", "compare --json -")
    j = json_alone(xgrad, ["gradcheck", "--filter", "ops/add", "--json", "-"])
    need(j["checks"] and all(c["passed"] for c in j["checks"]), "gradcheck --json -")
    for form in (["--json", "-"], ["--json"]):
        docs = json_alone(xgrad, ["tokenizer", "encode", "--tokenizer", "bytes", "--string", "ab"] + form, lines=True)
        need(docs[0]["ids"] == [97, 98], f"tokenizer encode {' '.join(form)}")
    # encode --json FILE: the ids on stdout, the JSON lines in FILE.
    path = os.path.join(w, "enc.json")
    r = run(xgrad, ["tokenizer", "encode", "--tokenizer", "bytes", "--string", "ab", "--json", path])
    need(r.stdout == "97 98\n", f"encode --json FILE: stdout {r.stdout!r}")
    with open(path) as f:
        need(json.loads(f.read())["ids"] == [97, 98], "encode --json FILE: the file")
    print("--json -: generate, inspect, eval, convert, compare, gradcheck, tokenizer encode write JSON alone")


def refused_then_overwritten(xgrad, args, path, w):
    """`path` exists: args is refused (exit 2, one line naming --overwrite, path untouched);
    args + --overwrite replaces it."""
    if os.path.isdir(path):
        fail(f"{path} is a folder")
    with open(path, "w") as f:
        f.write("keep me\n")
    r = run(xgrad, args, want=2, cwd=w)
    lines = r.stderr.splitlines()
    need(len(lines) == 1 and lines[0].startswith("xgrad: ") and "exists" in lines[0] and "--overwrite" in lines[0],
         f"xgrad {' '.join(args)}: stderr {r.stderr!r}")
    with open(path) as f:
        need(f.read() == "keep me\n", f"xgrad {' '.join(args)}: refused, but {path} changed")
    run(xgrad, args + ["--overwrite"], cwd=w)
    with open(path, "rb") as f:
        need(f.read() != b"keep me\n", f"xgrad {' '.join(args)} --overwrite: {path} not replaced")


def check_overwrite(xgrad, w, model, text_run, text):
    o = lambda name: os.path.join(w, name)
    refused_then_overwritten(xgrad, ["generate", "--checkpoint", model, "--prompt", "1|", "--max-new", "1", "--json",
                                     o("g.json")], o("g.json"), w)
    refused_then_overwritten(xgrad, ["generate", "--checkpoint", model, "--prompt", "1|", "--max-new", "1",
                                     "--attention-map", o("a.png")], o("a.gp"), w)
    refused_then_overwritten(xgrad, ["inspect", "--checkpoint", model, "--json", o("i.json")], o("i.json"), w)
    refused_then_overwritten(xgrad, ["eval", "--checkpoint", text_run, "--text", text, "--json", o("e.json")],
                             o("e.json"), w)
    refused_then_overwritten(xgrad, ["convert", "--kv-heads", "1", model, o("c2.safetensors"), "--heldout", "20"],
                             o("c2.safetensors"), w)
    refused_then_overwritten(xgrad, ["convert", "--kv-heads", "1", model, o("c3.safetensors"), "--heldout", "20",
                                     "--json", o("c3.json")], o("c3.json"), w)
    refused_then_overwritten(xgrad, ["compare", o("d1"), o("d2"), "--json", o("cmp.json")], o("cmp.json"), w)
    refused_then_overwritten(xgrad, ["compare", o("d1"), o("d2"), "--out", o("cmp.png")], o("cmp.gp"), w)
    refused_then_overwritten(xgrad, ["gradcheck", "--filter", "ops/add", "--json", o("gc.json")], o("gc.json"), w)
    refused_then_overwritten(xgrad, ["tokenizer", "encode", "--tokenizer", "bytes", "--string", "x", "--json",
                                     o("t.json")], o("t.json"), w)
    os.makedirs(o("vis"), exist_ok=True)
    refused_then_overwritten(xgrad, ["visibility", "--out", o("vis")], o("vis/causal.gp"), w)
    refused_then_overwritten(xgrad, ["export", "llama2c", o("u1"), o("u1.bin")], o("u1.bin"), w)
    refused_then_overwritten(xgrad, ["import", "llama2c", o("u1.bin"), o("u1.safetensors")], o("u1.safetensors"), w)
    if run(xgrad, ["report", "--help"]).returncode == 0 and os.path.exists("/usr/share/javascript/dygraphs"):
        refused_then_overwritten(xgrad, ["report", o("d1"), "--out", o("r.html")], o("r.html"), w)
    print("--overwrite: every output that exists is refused without it and replaced with it")


def check_run_folder(xgrad, w, model):
    folder = os.path.dirname(model)
    a = run(xgrad, ["generate", "--checkpoint", folder, "--prompt", "123|", "--max-new", "3"]).stdout
    b = run(xgrad, ["generate", "--checkpoint", model, "--prompt", "123|", "--max-new", "3"]).stdout
    need(a == b, f"generate --checkpoint RUN differs from RUN/model.safetensors: {a!r} {b!r}")
    a = run(xgrad, ["inspect", "--checkpoint", folder, "--json", "-"]).stdout
    need(json.loads(a)["checkpoint"] == os.path.join(folder, "model.safetensors"), "inspect --checkpoint RUN")
    r = run(xgrad, ["generate", "--checkpoint", w, "--prompt", "1|"], want=2)
    need("is a folder without model.safetensors" in r.stderr, f"generate --checkpoint FOLDER: {r.stderr!r}")
    print("a run folder is accepted where a checkpoint is (its model.safetensors)")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    xgrad, w = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    check_help(xgrad)
    check_deprecated(xgrad, w)
    text = os.path.join(w, "text.txt")
    with open(text, "w") as f:
        f.write("the quick brown fox jumps over the lazy dog.\n" * 400)
    text_run = os.path.join(w, "lm")
    run(xgrad, ["train", "--task", "text", "--text", text, "--context", "8", "--steps", "2", "--out", text_run] + SMALL)
    model = os.path.join(w, "d1", "model.safetensors")
    check_json_stdout(xgrad, w, model, text_run, text)
    check_overwrite(xgrad, w, model, text_run, text)
    check_run_folder(xgrad, w, model)
    print("options OK")


if __name__ == "__main__":
    main()
