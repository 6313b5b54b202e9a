#!/usr/bin/env python3
"""A folder that cannot be listed is reported as such, not as a folder without files
(docs/reliability.md, "Input files"):

    check_unlistable_folders.py XGRAD WORKDIR

The folder has mode 000. Root reads it anyway (CAP_DAC_OVERRIDE), so under root the commands
run as the unprivileged user 65534 (nobody), for whom the mode holds; the work folder is
handed to that user. Commands: tokenizer train FOLDER (when SentencePiece is built in),
train --task text --text FOLDER, eval --text FOLDER, and the same with the locked folder
inside a readable one.
"""
import os
import shutil
import subprocess
import sys

SMALL = ["--batch", "8", "--d-model", "16", "--heads", "2", "--layers", "1", "--no-progress", "--no-plot",
         "--threads", "1"]
NOBODY = 65534


def fail(msg):
    sys.exit(f"FAILED: {msg}")


def drop():
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def xg(xgrad, args, cwd):
    return subprocess.run([xgrad] + args, capture_output=True, text=True, errors="replace", cwd=cwd, timeout=600, preexec_fn=drop)


def main():
    xgrad, work = os.path.abspath(sys.argv[1]), sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    w = os.path.abspath(work)
    if xg(xgrad, ["--version"], w).returncode != 0:
        print(f"skipped: user {NOBODY} cannot run {xgrad} (a folder on its path is closed to others)")
        sys.exit(77)
    corpus = os.path.join(w, "corpus")
    os.makedirs(corpus)
    for name, line in (("a.txt", "the quick brown fox jumps over the lazy dog.\n"),
                       ("b.txt", "license terms and conditions of the software\n")):
        with open(os.path.join(corpus, name), "w") as f:
            f.write(line * 400)
    subprocess.run([xgrad, "train", "--task", "text", "--tokenizer", "bytes", "--text", corpus, "--context", "8",
                    "--steps", "2", "--out", os.path.join(w, "run")] + SMALL, check=True, capture_output=True, cwd=w)
    locked = os.path.join(w, "locked")
    shutil.copytree(corpus, locked)
    outer = os.path.join(w, "outer")
    os.makedirs(outer)
    shutil.copy(os.path.join(corpus, "a.txt"), outer)
    shutil.copytree(corpus, os.path.join(outer, "inner"))
    for base, dirs, files in os.walk(w):
        for n in dirs + files:
            os.lchown(os.path.join(base, n), NOBODY, NOBODY) if os.getuid() == 0 else None
    if os.getuid() == 0:
        os.chown(w, NOBODY, NOBODY)
    os.chmod(locked, 0)
    os.chmod(os.path.join(outer, "inner"), 0)

    model = os.path.join(w, "run", "model.safetensors")
    cases = [
        (["train", "--task", "text", "--tokenizer", "bytes", "--text", locked, "--context", "8", "--steps", "2",
          "--out", os.path.join(w, "o1")] + SMALL, ["cannot list the folder", "locked", "permission denied"]),
        (["eval", "--checkpoint", model, "--text", locked], ["cannot list the folder", "locked", "permission denied"]),
        (["eval", "--checkpoint", model, "--text", outer], ["cannot list the folder", "inner", "permission denied"]),
    ]
    r = xg(xgrad, ["tokenizer", "train", "--vocab-size", "300", "--out", os.path.join(w, "t.model"), corpus], w)
    if r.returncode == 0:
        cases.append((["tokenizer", "train", "--vocab-size", "300", "--out", os.path.join(w, "t2.model"), locked],
                      ["cannot be listed", "locked", "permission denied"]))
    elif "built without SentencePiece" in r.stderr:
        print("skipped: tokenizer train (this build has no SentencePiece)")
    else:
        fail(f"tokenizer train as user {NOBODY}: {r.stderr}")
    failures = []  # every case runs; all failures are listed at the end
    for args, words in cases:
        r = xg(xgrad, args, w)
        lines = r.stderr.strip("\n").split("\n")
        where = f"xgrad {' '.join(args)}"
        if r.returncode != 2 or len(lines) != 1 or not lines[0].startswith("xgrad: "):
            failures.append(f"{where}: exit {r.returncode}, expected 2 and one line; stderr: {r.stderr.strip()}")
            continue
        missing = [word for word in words if word.lower() not in lines[0].lower()]
        if missing:
            failures.append(f"{where}: {missing} missing in: {lines[0]}")
        elif "no files" in lines[0] or "without files" in lines[0]:
            failures.append(f"{where}: a folder that cannot be listed reported as empty: {lines[0]}")
        else:
            print(f"ok: {lines[0]}")
    os.chmod(locked, 0o755)
    os.chmod(os.path.join(outer, "inner"), 0o755)
    if failures:
        fail("\n".join(failures))
    print("check_unlistable_folders: every unlistable folder named as such")


if __name__ == "__main__":
    main()
