#!/usr/bin/env python3
"""No output replaces an input (docs/cli.md, "Files a command reads and writes"):

    check_output_guard.py XGRAD WORKDIR

For every command with an output file, and every pair of one of its inputs and one of its
outputs, the output is given as the input itself, spelled two ways (the same path with './'
and a symbolic link to it; a run folder given where its model is meant counts as that model).
Each run must exit 2 before any work with one line 'xgrad: ...' that says why (the two
flags name the same file, or the output is in an input folder), and the input must keep
every byte (and its inode: it was not replaced by an equal copy either).
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys

SMALL = ["--batch", "8", "--d-model", "16", "--heads", "2", "--layers", "1", "--no-progress", "--no-plot",
         "--threads", "1"]
FAILURES = []  # every pair is tried; all failures are listed at the end
WHY = re.compile(r"name the same file|is IN itself|itself|in the --text folder|in the corpus folder")


def fail(msg):
    sys.exit(f"FAILED: {msg}")


def run(xgrad, args, cwd, want=0):
    r = subprocess.run([xgrad] + args, capture_output=True, text=True, errors="replace", cwd=cwd, timeout=600)
    if r.returncode != want:
        fail(f"xgrad {' '.join(args)}: exit {r.returncode}, expected {want}\nstdout: {r.stdout}\nstderr: {r.stderr}")
    return r


def fingerprint(path):
    st = os.stat(path)
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest(), st.st_ino, st.st_size


def make_fixtures(xgrad, w):
    corpus = os.path.join(w, "corpus")
    os.makedirs(corpus)
    for name, line in (("a.txt", "the quick brown fox jumps over the lazy dog.\n"),
                       ("b.txt", "license terms and conditions of the software\n")):
        with open(os.path.join(corpus, name), "w") as f:
            f.write(line * 400)
    run(xgrad, ["train", "--task", "text", "--tokenizer", "bytes", "--text", corpus, "--context", "8", "--steps", "2",
                "--out", os.path.join(w, "run")] + SMALL, w)
    r = subprocess.run([xgrad, "tokenizer", "train", "--vocab-size", "300", "--out", os.path.join(w, "tok.model"),
                        corpus], capture_output=True, text=True, errors="replace", cwd=w, timeout=600)
    have_tok = r.returncode == 0
    if not have_tok and "built without SentencePiece" not in r.stderr:
        fail(f"tokenizer train: exit {r.returncode}: {r.stderr}")
    run(xgrad, ["gradcheck", "--filter", "ops/add*", "--json", os.path.join(w, "g.json")], w)
    run(xgrad, ["train", "--arch", "llama", "--n-digits", "4", "--steps", "2", "--out", os.path.join(w, "llama")] + SMALL, w)
    run(xgrad, ["export", "llama2c", os.path.join(w, "llama", "model.safetensors"), os.path.join(w, "m.bin")], w)
    return have_tok


def cases(w, have_tok):
    """(command name, input flag, input file, output flag, argv with OUT standing for the output,
    the output's extension or None when any name will do)."""
    M = os.path.join(w, "run", "model.safetensors")
    RUN = os.path.join(w, "run")
    A = os.path.join(w, "corpus", "a.txt")
    CORPUS = os.path.join(w, "corpus")
    TOK = os.path.join(w, "tok.model")
    G = os.path.join(w, "g.json")
    L = os.path.join(w, "llama", "model.safetensors")
    B = os.path.join(w, "m.bin")
    gen = ["generate", "--checkpoint", M, "--prompt", "the", "--max-new", "2"]
    out = []
    # generate: --checkpoint, --tokenizer -> --json, --attention-map, its gnuplot script
    gen_inputs = [("--checkpoint", M, gen)]
    if have_tok:
        gen_inputs.append(("--tokenizer", TOK, gen + ["--tokenizer", TOK]))
    for flag, f, base in gen_inputs:
        out.append(("generate", flag, f, "--json", base + ["--json", "OUT"], None))
        out.append(("generate", flag, f, "--attention-map", base + ["--attention-map", "OUT"], ".png"))
        out.append(("generate", flag, f, "--attention-map's script",
                    base + ["--attention-map", "OUT.png"], ".gp"))
    # eval: --checkpoint (a file, a run folder), --text (a file, a file of a folder), --tokenizer -> --json
    ev = ["eval", "--checkpoint", M, "--text", A]
    out.append(("eval", "--checkpoint", M, "--json", ev + ["--json", "OUT"], None))
    out.append(("eval", "--checkpoint RUN", M, "--json", ["eval", "--checkpoint", RUN, "--text", A, "--json", "OUT"], None))
    out.append(("eval", "--text", A, "--json", ev + ["--json", "OUT"], None))
    out.append(("eval", "--text FOLDER", A, "--json", ["eval", "--checkpoint", M, "--text", CORPUS, "--json", "OUT"], None))
    if have_tok:
        out.append(("eval", "--tokenizer", TOK, "--json", ev + ["--tokenizer", TOK, "--json", "OUT"], None))
    # inspect: --checkpoint -> --json
    out.append(("inspect", "--checkpoint", M, "--json", ["inspect", "--checkpoint", M, "--json", "OUT"], None))
    # convert: IN, --text -> OUT, --json
    for flag, f in (("IN", M), ("--text", A)):
        base = ["convert", "--kv-heads", "1", "--overwrite", M]
        out.append(("convert", flag, f, "OUT", base + ["OUT", "--text", A], None))
        out.append(("convert", flag, f, "--json", base + [os.path.join(w, "c.safetensors"), "--text", A, "--json", "OUT"], None))
    # export / import llama2c: IN -> OUT
    out.append(("export llama2c", "IN", L, "OUT", ["export", "llama2c", "--overwrite", L, "OUT"], None))
    out.append(("import llama2c", "IN", B, "OUT", ["import", "llama2c", "--overwrite", B, "OUT"], None))
    # report: RUN's files, --checkpoint, --gradcheck -> --out
    rep = ["report", RUN, "--out", "OUT"]
    for name in ("log.csv", "model.safetensors", "config.json", "train_state.safetensors", "run_id.txt"):
        out.append(("report", "RUN's " + name, os.path.join(RUN, name), "--out", rep, ".html"))
    out.append(("report", "--checkpoint", M, "--out", rep + ["--checkpoint", M, "--prompt", "the"], ".html"))
    out.append(("report", "--gradcheck", G, "--out", rep + ["--gradcheck", G], ".html"))
    # compare: RUN's files -> --out, its gnuplot script, --json
    for name in ("log.csv", "model.safetensors", "config.json"):
        f = os.path.join(RUN, name)
        out.append(("compare", "RUN's " + name, f, "--out", ["compare", RUN, "--out", "OUT"], ".png"))
        out.append(("compare", "RUN's " + name, f, "--out's script", ["compare", RUN, "--out", "OUT.png"], ".gp"))
        out.append(("compare", "RUN's " + name, f, "--json", ["compare", RUN, "--json", "OUT"], None))
    # tokenizer train: FILES (a file, a file of a folder) -> --out
    if have_tok:
        out.append(("tokenizer train", "FILES", A, "--out",
                    ["tokenizer", "train", "--vocab-size", "300", "--overwrite", "--out", "OUT", A], None))
        out.append(("tokenizer train", "FILES FOLDER", A, "--out",
                    ["tokenizer", "train", "--vocab-size", "300", "--overwrite", "--out", "OUT", CORPUS], None))
    return out


def train_cases(w, have_tok):
    """train writes a folder: each input is placed in a fresh --out folder under the name of one
    of the run's files; (input flag, the run file's name, argv with O for the folder, source)."""
    text = ["--task", "text", "--tokenizer", "bytes", "--context", "8", "--steps", "2"] + SMALL
    M = os.path.join(w, "run", "model.safetensors")
    A = os.path.join(w, "corpus", "a.txt")
    out = [("--config", "config.json", lambda o: ["train", "--config", os.path.join(o, "config.json"), "--out", o,
                                                   "--overwrite"], os.path.join(w, "run", "config.json")),
           ("--init-from", "model.safetensors",
            lambda o: ["train", "--init-from", os.path.join(o, "model.safetensors"), "--text", A, "--out", o,
                       "--overwrite"] + text, M),
           ("--text", "log.csv", lambda o: ["train", "--text", os.path.join(o, "log.csv"), "--out", o] + text, A),
           ("--text", "train.bin", lambda o: ["train", "--text", os.path.join(o, "train.bin"), "--out", o] + text, A)]
    if have_tok:
        out.append(("--tokenizer", "model_best.safetensors",
                    lambda o: ["train", "--task", "text", "--text", A, "--tokenizer",
                               os.path.join(o, "model_best.safetensors"), "--out", o, "--steps", "2"] + SMALL,
                    os.path.join(w, "tok.model")))
    return out


def check_refused(xgrad, w, args, inputs, label):
    before = {p: fingerprint(p) for p in inputs}
    r = subprocess.run([xgrad] + args, capture_output=True, text=True, errors="replace", cwd=w, timeout=600)
    lines = r.stderr.strip("\n").split("\n")
    problems = []
    if r.returncode != 2:
        problems.append(f"exit {r.returncode}, expected 2")
    if len(lines) != 1 or not lines[0].startswith("xgrad: "):
        problems.append("stderr is not one 'xgrad: ...' line")
    elif not WHY.search(lines[0]):
        problems.append("the line does not say the output is an input")
    for p in inputs:
        if fingerprint(p) != before[p]:
            problems.append(f"{p} changed")
    if problems:
        FAILURES.append(f"{label}: {'; '.join(problems)}\n  xgrad {' '.join(args)}\n  stderr: {r.stderr.strip()}")


def main():
    xgrad, work = os.path.abspath(sys.argv[1]), sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    w = os.path.abspath(work)
    have_tok = make_fixtures(xgrad, w)
    all_inputs = [os.path.join(w, "corpus", n) for n in ("a.txt", "b.txt")] + \
                 [os.path.join(w, "run", n) for n in os.listdir(os.path.join(w, "run"))
                  if os.path.isfile(os.path.join(w, "run", n))] + \
                 [os.path.join(w, n) for n in ("g.json", "m.bin", "tok.model") if os.path.exists(os.path.join(w, n))] + \
                 [os.path.join(w, "llama", "model.safetensors")]
    n = 0
    links = os.path.join(w, "links")
    os.makedirs(links)
    for i, (cmd, in_flag, f, out_flag, argv, ext) in enumerate(cases(w, have_tok)):
        spellings = []
        if ext is None:  # the same file by another spelling: ./ in its folder
            spellings.append(("./" + os.path.relpath(f, w), "path"))
        link = os.path.join(links, f"l{i}{ext or os.path.splitext(f)[1]}")
        os.symlink(f, link)
        spellings.append((link, "link"))
        for spelled, how in spellings:
            if any(a != "OUT" and "OUT" in a for a in argv):  # a derived output: OUT.png -> its OUT.gp
                stem = spelled[:-len(ext)]
                args = [a.replace("OUT", stem) for a in argv]
            else:
                args = [spelled if a == "OUT" else a for a in argv]
            check_refused(xgrad, w, args, all_inputs, f"{cmd}: {out_flag} = {in_flag} ({how})")
            n += 1
    for i, (in_flag, name, argv, source) in enumerate(train_cases(w, have_tok)):
        o = os.path.join(w, f"train_out{i}")
        os.makedirs(o)
        shutil.copyfile(source, os.path.join(o, name))
        check_refused(xgrad, w, argv(o), all_inputs + [os.path.join(o, name)], f"train: --out's {name} = {in_flag}")
        if sorted(os.listdir(o)) != [name]:
            FAILURES.append(f"train: --out's {name} = {in_flag}: the folder now holds {sorted(os.listdir(o))}")
        n += 1
    if FAILURES:
        fail(f"{len(FAILURES)} of {n} cases:\n" + "\n".join(FAILURES))
    print(f"check_output_guard: {n} refusals checked" +
          ("" if have_tok else " (no SentencePiece in this build: the .model tokenizer pairs are skipped)"))


if __name__ == "__main__":
    main()
