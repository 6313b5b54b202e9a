#!/usr/bin/env python3
"""A refused `xgrad train` changes no file (docs/reliability.md, "Refused commands"):

    check_refused_runs.py XGRAD WORKDIR

Every check runs before the first byte is written, so each refusal below must leave the
folders involved exactly as they were: the same names, the same bytes, and the same inodes
(a file replaced by an equal copy counts as changed). The text task tokenises its corpus into
the run folder's train.bin and val.bin; these cases are refused after that:
- a new run whose --init-from model does not match it (a new folder must not appear, an
  existing empty one stays empty): a tokenizer with more ids than the model's vocabulary, now
  refused before tokenising (a fitting tokenizer fine-tunes the model: check_fine_tune.py);
- a --resume whose corpus changed, or (with SentencePiece) whose tokenizer file changed;
- a --resume whose val.bin is a folder (train.bin must not have been rewritten first).
"""
import os
import shutil
import subprocess
import sys

FAILURES = []  # every case runs; all failures are listed at the end
SMALL = ["--batch", "8", "--d-model", "16", "--heads", "2", "--layers", "1", "--no-progress", "--no-plot",
         "--threads", "1"]


def fail(msg):
    sys.exit(f"FAILED: {msg}")


def run(xgrad, args, cwd, want=0):
    r = subprocess.run([xgrad] + args, capture_output=True, text=True, errors="replace", cwd=cwd, timeout=600)
    if r.returncode != want:
        fail(f"xgrad {' '.join(args)}: exit {r.returncode}, expected {want}\nstdout: {r.stdout}\nstderr: {r.stderr}")
    return r


def snapshot(folder):
    """Every entry under `folder`: (kind, bytes, inode, mtime) of files; kind of folders."""
    out = {}
    for base, dirs, files in os.walk(folder):
        for d in dirs:
            out[os.path.relpath(os.path.join(base, d), folder)] = ("dir",)
        for name in files:
            p = os.path.join(base, name)
            st = os.lstat(p)
            with open(p, "rb") as f:
                out[os.path.relpath(p, folder)] = ("file", f.read(), st.st_ino, st.st_mtime_ns)
    return out


def refused(xgrad, w, args, want, words, watch, label):
    """Runs a command that must be refused (exit `want`, one line holding `words`) and leave
    every folder in `watch` as it was (a folder that did not exist must still not exist)."""
    before = {d: snapshot(d) if os.path.exists(d) else None for d in watch}
    r = subprocess.run([xgrad] + args, capture_output=True, text=True, errors="replace", cwd=w, timeout=600)
    lines = r.stderr.strip("\n").split("\n")
    if r.returncode != want or len(lines) != 1 or not lines[0].startswith("xgrad: "):
        return FAILURES.append(f"{label}: exit {r.returncode} (expected {want}), stderr: {r.stderr.strip()}")
    for word in words:
        if word.lower() not in lines[0].lower():
            return FAILURES.append(f"{label}: '{word}' missing in: {lines[0]}")
    for d in watch:
        if before[d] is None:
            if os.path.lexists(d):
                return FAILURES.append(f"{label}: the refused command left {d} behind (holding "
                                       f"{sorted(os.listdir(d))})")
        elif before[d] != snapshot(d):
            after = snapshot(d)
            changed = sorted(k for k in before[d].keys() | after.keys() if before[d].get(k) != after.get(k))
            return FAILURES.append(f"{label}: the refused command changed {changed} in {d}")
    print(f"ok: {label}")


def write_corpus(folder):
    os.makedirs(folder, exist_ok=True)
    for name, line in (("a.txt", "the quick brown fox jumps over the lazy dog.\n"),
                       ("b.txt", "license terms and conditions of the software\n")):
        with open(os.path.join(folder, name), "w") as f:
            f.write(line * 400)


def main():
    xgrad, work = os.path.abspath(sys.argv[1]), sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    w = os.path.abspath(work)
    corpus = os.path.join(w, "corpus")
    write_corpus(corpus)
    text = ["--task", "text", "--text", corpus, "--context", "8"] + SMALL

    # A SentencePiece tokenizer (when this build has SentencePiece).
    tok = os.path.join(w, "tok.model")
    r = subprocess.run([xgrad, "tokenizer", "train", "--vocab-size", "300", "--out", tok, corpus], capture_output=True,
                       text=True, errors="replace", cwd=w, timeout=600)
    have_tok = r.returncode == 0
    if not have_tok and "built without SentencePiece" not in r.stderr:
        fail(f"tokenizer train: {r.stderr}")

    # A new run refused: the --init-from model (bytes, 256 ids) is smaller than the tokenizer
    # (300 ids).
    if have_tok:
        byterun = os.path.join(w, "byterun")
        run(xgrad, ["train", "--tokenizer", "bytes", "--steps", "2", "--out", byterun] + text, w)
        init = os.path.join(byterun, "model.safetensors")
        new = os.path.join(w, "new")
        refused(xgrad, w, ["train", "--init-from", init, "--tokenizer", tok, "--steps", "2", "--out",
                           os.path.join(new, "run")] + text, 2, ["--init-from", "300 ids", "vocabulary of 256"], [new],
                "a new run in a new folder, refused (--init-from, a tokenizer larger than the model)")
        empty = os.path.join(w, "empty")
        os.makedirs(empty)
        refused(xgrad, w, ["train", "--init-from", init, "--tokenizer", tok, "--steps", "2", "--out", empty] +
                text, 2, ["--init-from", "300 ids", "vocabulary of 256"], [empty],
                "a new run in an empty folder, refused (--init-from, a tokenizer larger than the model)")
    else:
        print("skipped: --init-from with another tokenizer (this build has no SentencePiece)")

    # --resume of a run stopped at step 2 of 4, refused after tokenising.
    def fresh_run(name, tokenizer="bytes"):
        c = os.path.join(w, name + "_corpus")
        shutil.rmtree(c, ignore_errors=True)
        write_corpus(c)
        out = os.path.join(w, name)
        run(xgrad, ["train", "--task", "text", "--text", c, "--context", "8", "--tokenizer", tokenizer, "--steps", "4",
                    "--stop-at", "2", "--out", out] + SMALL, w)
        return out, c

    out, c = fresh_run("changed_corpus")
    with open(os.path.join(c, "a.txt"), "a") as f:
        f.write("one more line\n")
    refused(xgrad, w, ["train", "--resume", out, "--no-progress", "--no-plot"], 1, ["changed"], [out, c],
            "--resume after the corpus changed")

    out, c = fresh_run("val_folder")
    os.remove(os.path.join(out, "val.bin"))
    os.mkdir(os.path.join(out, "val.bin"))
    refused(xgrad, w, ["train", "--resume", out, "--no-progress", "--no-plot"], 1, ["val.bin", "folder"], [out, c],
            "--resume with val.bin a folder")

    if have_tok:
        tok2 = os.path.join(w, "tok2.model")
        shutil.copyfile(tok, tok2)
        out, c = fresh_run("changed_tokenizer", tok2)
        run(xgrad, ["tokenizer", "train", "--vocab-size", "280", "--overwrite", "--out", tok2, corpus], w)
        refused(xgrad, w, ["train", "--resume", out, "--no-progress", "--no-plot"], 1, ["tokenizer", "differs"],
                [out, c], "--resume after the tokenizer changed")
    else:
        print("skipped: --resume after the tokenizer changed (this build has no SentencePiece)")

    if FAILURES:
        fail("\n".join(FAILURES))
    print("check_refused_runs: all refusals left their folders as they were")


if __name__ == "__main__":
    main()
