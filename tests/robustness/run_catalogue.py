#!/usr/bin/env python3
"""Runs the robustness catalogue (tests/robustness/cli_cases.txt and file_cases.txt) against
an xgrad binary and fails on any abort, signal, hang (per-case timeout), sanitizer report or
unexpected outcome (exit status, message key words, files that must stay untouched).

    run_catalogue.py XGRAD WORKDIR [--only SUBSTRING] [--timeout SECONDS] [--jobs N]

Case files: one case per line, fields separated by " | ", '#' starts a comment line.
  cli_cases.txt:  id | fixture | exit | key words | untouched | command
  file_cases.txt: id | fixture | file | mutation | exit | key words | untouched | command
fixture:   - (an empty folder) or gpt / encdec / charlm: a small run folder made once by this
           script with xgrad itself (gpt stops at step 2 of 4 so it can be resumed; charlm is a
           text run, as --task charlm now is; lora is that run with --lora-rank 2); charlm_v0: a charlm run saved by xgrad 0.2.0
           (tests/fixtures/runs_v0/charlm, stopped at step 3 of 6); tok: a
           folder with tok.model (`xgrad tokenizer train --vocab-size 300` on corpus/), the
           corpus/ folder, an empty folder empty/ and the files small.txt (a few words),
           empty.txt, binary.bin (NUL bytes), latin1.txt (Latin-1, not UTF-8) and marks.txt (only
           U+2581). In a build without SentencePiece the tok cases are skipped (and counted).
           tbin: a llama2.c tokenizer.bin and Llama checkpoints (tests/support/llama2c_fixture.py).
           l2c: llama2.c model files written by this script (make_l2c_fixture): model.bin
           (legacy, shared classifier), untied.bin (legacy), v1.bin (version 1), v2.bin
           (version 2, int8, group size 8) and model.safetensors (`xgrad import llama2c` of
           model.bin).
exit:      the expected exit status (0 success, 1 runtime error, 2 usage error).
key words: comma-separated, all must appear (case-insensitive) in stderr (on failure) or
           stdout (on success); '-' for none.
untouched: 'all' (every file under the case folder keeps its bytes and no file appears or
           disappears), '-' (no check) or space-separated paths relative to the case folder.
file:      the file (relative to the run folder) the mutation applies to.
command:   the arguments after `xgrad`, split like a shell would; {run} is the case's copy of
           the fixture, {dir} the case folder (also the working directory). A first word
           '>FILE' sends stdout to FILE (e.g. >/dev/full: a write that fails) instead of a pipe.
On failure (exit != 0) stderr must be exactly one line starting with "xgrad: ".
"""
import argparse
import hashlib
import json
import math
import os
import shlex
import shutil
import stat
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
SANITIZER_MARKERS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "runtime error:",
                     "terminate called", "Aborted", "Segmentation fault", "core dumped")

SMALL = ["--batch", "8", "--d-model", "16", "--heads", "2", "--layers", "1", "--no-progress", "--no-plot",
         "--threads", "1"]


def make_fixtures(xgrad, root):
    os.makedirs(root, exist_ok=True)
    text = os.path.join(root, "text.txt")
    with open(text, "w") as f:
        f.write("the quick brown fox jumps over the lazy dog.\n" * 400)  # 18 KB: text cuts 4 documents
    runs = {
        "gpt": ["train", "--steps", "4", "--stop-at", "2", "--n-digits", "4"] + SMALL,
        "encdec": ["train", "--task", "reverse", "--steps", "2"] + SMALL,
        "charlm": ["train", "--task", "charlm", "--text", text, "--context", "8", "--steps", "2"] + SMALL,
        "lora": ["train", "--task", "charlm", "--text", text, "--context", "8", "--steps", "2", "--lora-rank", "2"] + SMALL,
    }
    for name, args in runs.items():
        out = os.path.join(root, name)
        shutil.rmtree(out, ignore_errors=True)
        r = subprocess.run([xgrad] + args + ["--out", out], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            sys.exit(f"catalogue: fixture {name} failed ({r.returncode}): {r.stderr}")
        shutil.copy(text, os.path.join(out, "text.txt"))
    make_charlm_v0_fixture(root)
    make_l2c_fixture(xgrad, root)
    return make_tokenizer_fixture(xgrad, root) | make_llama2c_fixture(xgrad, root)


def make_llama2c_fixture(xgrad, root):
    """The tbin fixture (tests/support/llama2c_fixture.py): tokenizer.bin (300 pieces), bigram.safetensors
    (a Llama model of vocabulary 300 whose greedy output is known), byte_run/ (the vocabulary-256
    run it was made from) and corpus/. Returns {"tbin"} when it cannot be made (no numpy)."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))
    try:
        import llama2c_fixture
    except ImportError as e:
        if e.name != "numpy":
            raise
        return {"tbin"}
    folder = os.path.join(root, "tbin")
    shutil.rmtree(folder, ignore_errors=True)
    llama2c_fixture.make_checkpoint(xgrad, folder)
    return set()


def make_charlm_v0_fixture(root):
    """charlm_v0: a charlm run saved by xgrad 0.2.0 (tests/fixtures/runs_v0/charlm, stopped at
    step 3 of 6; `--task charlm` now starts text runs, so only such folders exercise the charlm
    pipeline from the command line). Its text, saved as the relative path corpus.txt, becomes
    the absolute path of the fixture's copy, so a resume finds it from any folder; text.txt is
    the same text for the cases that pass --text {run}/text.txt."""
    src = os.path.join(HERE, "..", "fixtures", "runs_v0", "charlm")
    out = os.path.join(root, "charlm_v0")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out)
    corpus = os.path.join(out, "corpus.txt")
    shutil.copy(os.path.join(src, "..", "corpus.txt"), corpus)
    shutil.copy(corpus, os.path.join(out, "text.txt"))
    state = os.path.join(out, "train_state.safetensors")
    header, data = st_read(state)
    header["__metadata__"]["opt.text"] = corpus
    st_write(state, header, data)


def make_l2c_fixture(xgrad, root):
    """The l2c fixture: dim 16, hidden_dim 24, 2 layers, 4 heads, 2 KV heads, vocabulary 11,
    seq_len 8, weights 0.01 * (i % 97 - 48), in llama2.c's formats (written here, not by xgrad).
    model.bin is 16540 bytes: the 28-byte header, tok_embeddings.weight at byte 28, the RoPE
    tables in its last 128 bytes; v1.bin has its shared_classifier byte at 36."""
    out = os.path.join(root, "l2c")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    dim, hidden, layers, heads, kv, vocab, seq = 16, 24, 2, 4, 2, 11, 8
    hs = dim // heads
    per_layer = 2 * dim + dim * dim + 2 * kv * hs * dim + dim * dim + 3 * dim * hidden

    def weights(n):
        return struct.pack(f"<{n}f", *[0.01 * (i % 97 - 48) for i in range(n)])

    def tables():
        vals = [math.cos(t / 10000 ** (2 * i / hs)) for t in range(seq) for i in range(hs // 2)]
        vals += [math.sin(t / 10000 ** (2 * i / hs)) for t in range(seq) for i in range(hs // 2)]
        return struct.pack(f"<{len(vals)}f", *vals)

    def header(v):
        return struct.pack("<7i", dim, hidden, layers, heads, kv, v, seq)

    body = weights(vocab * dim + layers * per_layer + dim)  # run.c's order up to the final norm
    files = {"model.bin": header(vocab) + body + tables(),
             "untied.bin": header(-vocab) + body + tables() + weights(vocab * dim)}
    v1 = struct.pack("<Ii", 0x616B3432, 1) + header(vocab) + b"\x01"
    files["v1.bin"] = v1 + b"\0" * (256 - len(v1)) + body
    # version 2 (int8 Q8_0), group size 8 at byte 37: the norms, then int8 values and scales.
    v2 = struct.pack("<Ii", 0x616B3432, 2) + header(vocab) + b"\x01" + struct.pack("<i", 8)
    norms = weights(2 * layers * dim + dim)
    q8 = b""
    for n in [vocab * dim] + [dim * dim] * layers + [kv * hs * dim] * (2 * layers) + [dim * dim] * layers + \
            [dim * hidden] * (3 * layers):
        q8 += bytes((i * 37) % 255 for i in range(n)) + struct.pack(f"<{n // 8}f", *([0.01] * (n // 8)))
    files["v2.bin"] = v2 + b"\0" * (256 - len(v2)) + norms + q8
    for name, data in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    r = subprocess.run([xgrad, "import", "llama2c", os.path.join(out, "model.bin"),
                        os.path.join(out, "model.safetensors")], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"catalogue: fixture l2c failed ({r.returncode}): {r.stderr}")


def make_tokenizer_fixture(xgrad, root):
    """The tok fixture; returns the fixtures that cannot be made ({"tok"} without SentencePiece)."""
    tok = os.path.join(root, "tok")
    shutil.rmtree(tok, ignore_errors=True)
    os.makedirs(os.path.join(tok, "corpus"))
    os.makedirs(os.path.join(tok, "empty"))
    files = {
        "corpus/a.txt": ("the quick brown fox jumps over the lazy dog.\n" * 60 +
                         "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F600\n" * 20).encode(),
        "corpus/b.txt": b"license terms and conditions of the software\n" * 40,
        "small.txt": b"abc abc abd\n",
        "empty.txt": b"",
        "binary.bin": b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4,
        "latin1.txt": "d\u00e9j\u00e0 \u00e9t\u00e9 \u00e0 \u00e9\u00e9\u00e9 ".encode("latin-1") * 20,
        "marks.txt": "\u2581".encode() * 10,
    }
    for name, data in files.items():
        with open(os.path.join(tok, name), "wb") as f:
            f.write(data)
    r = subprocess.run([xgrad, "tokenizer", "train", "--vocab-size", "300", "--out", os.path.join(tok, "tok.model"),
                        os.path.join(tok, "corpus")], capture_output=True, text=True, timeout=300)
    if r.returncode == 2 and "built without SentencePiece" in r.stderr:
        shutil.rmtree(tok)
        return {"tok"}
    if r.returncode != 0:
        sys.exit(f"catalogue: fixture tok failed ({r.returncode}): {r.stderr}")
    return set()


# --- safetensors editing (independent of xgrad's own code) ----------------------------------

def st_read(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def st_write(path, header, data):
    h = json.dumps(header, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def set_element(path, tensor, index, value):
    header, data = st_read(path)
    e = header[tensor]
    fmt, size = ("<f", 4) if e["dtype"] == "F32" else ("<d", 8)
    at = e["data_offsets"][0] + index * size
    data = data[:at] + struct.pack(fmt, value) + data[at + size:]
    st_write(path, header, data)


def drop_tensor(path, tensor):
    """Removes a tensor and its bytes, shifting the offsets of those after it."""
    header, data = st_read(path)
    b, e = header.pop(tensor)["data_offsets"]
    for k, v in header.items():
        if k != "__metadata__" and v["data_offsets"][0] >= e:
            v["data_offsets"] = [v["data_offsets"][0] - (e - b), v["data_offsets"][1] - (e - b)]
    st_write(path, header, data[:b] + data[e:])


def mutate(path, mutation, fixtures):
    op, _, arg = mutation.partition(":")
    raw = open(path, "rb").read() if os.path.isfile(path) else b""
    if op == "none":
        return
    if op == "empty":
        open(path, "wb").close()
    elif op == "delete":
        os.remove(path)
    elif op == "dir":
        os.remove(path)
        os.mkdir(path)
    elif op == "truncate":  # keep the first N bytes
        open(path, "wb").write(raw[:int(arg)])
    elif op == "cut":  # drop the last N bytes
        open(path, "wb").write(raw[:len(raw) - int(arg)])
    elif op == "appendtext":
        open(path, "ab").write(arg.encode().decode("unicode_escape").encode("latin-1"))
    elif op == "text":  # replace the whole file (\n, \xNN escapes)
        open(path, "wb").write(arg.encode().decode("unicode_escape").encode("latin-1"))
    elif op == "hdrlen":  # the 8-byte header length field
        open(path, "wb").write(struct.pack("<Q", int(arg)) + raw[8:])
    elif op == "header":  # replace the header JSON text, keep the data
        header, data = st_read(path)
        h = arg.encode()
        open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
    elif op == "hdrsub":  # FROM=>TO in the header text (first occurrence), length fixed
        n = struct.unpack("<Q", raw[:8])[0]
        old, new = arg.split("=>", 1)
        h = raw[8:8 + n].decode()
        if old not in h:
            raise ValueError(f"hdrsub: '{old}' not in the header")
        h = h.replace(old, new, 1).encode()
        open(path, "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
    elif op == "meta":  # KEY=VALUE in __metadata__ (a JSON string)
        key, value = arg.split("=", 1)
        header, data = st_read(path)
        header.setdefault("__metadata__", {})[key] = value
        st_write(path, header, data)
    elif op == "metajson":  # KEY=JSON in __metadata__ (any JSON value)
        key, value = arg.split("=", 1)
        header, data = st_read(path)
        header.setdefault("__metadata__", {})[key] = json.loads(value)
        st_write(path, header, data)
    elif op == "metadel":
        header, data = st_read(path)
        del header["__metadata__"][arg]
        st_write(path, header, data)
    elif op == "field":  # TENSOR.FIELD=JSON (FIELD dtype / shape / data_offsets), '-' removes it
        target, value = arg.split("=", 1)
        tensor, field = target.rsplit(".", 1)
        header, data = st_read(path)
        if value == "-":
            del header[tensor][field]
        else:
            header[tensor][field] = json.loads(value)
        st_write(path, header, data)
    elif op == "entry":  # TENSOR=JSON: the whole entry
        tensor, value = arg.split("=", 1)
        header, data = st_read(path)
        header[tensor] = json.loads(value)
        st_write(path, header, data)
    elif op == "rename":  # OLD=>NEW tensor name
        old, new = arg.split("=>", 1)
        header, data = st_read(path)
        header[new] = header.pop(old)
        st_write(path, header, data)
    elif op == "symlink":  # the file becomes a symbolic link to TARGET (which need not exist)
        if os.path.lexists(path):
            os.remove(path)
        os.symlink(arg, path)
    elif op == "fifo":  # the file becomes a named pipe that no one writes to
        if os.path.lexists(path):
            os.remove(path)
        os.mkfifo(path)
    elif op == "symloop":  # a folder (made if missing) with a text file and links 'loop', 'loop2' -> '.'
        os.makedirs(path, exist_ok=True)  # (two links back: a walk that follows them never ends)
        with open(os.path.join(path, "t.txt"), "w") as f:
            f.write("the quick brown fox jumps over the lazy dog.\n" * 200)
        os.symlink(".", os.path.join(path, "loop"))
        os.symlink(".", os.path.join(path, "loop2"))
    elif op == "linkpair":  # a folder (made if missing) with a text file and links a -> b, b -> a
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "t.txt"), "w") as f:
            f.write("the quick brown fox jumps over the lazy dog.\n" * 200)
        os.symlink("b", os.path.join(path, "a"))
        os.symlink("a", os.path.join(path, "b"))
    elif op == "drop":
        drop_tensor(path, arg)
    elif op == "dup":  # SRC=>NEW: a copy of tensor SRC (its bytes appended) under the name NEW
        src, new = arg.split("=>", 1)
        header, data = st_read(path)
        b, e = header[src]["data_offsets"]
        header[new] = dict(header[src], data_offsets=[len(data), len(data) + e - b])
        st_write(path, header, data + data[b:e])
    elif op == "copy":  # FIXTURE/FILE: replace the file by that file of another fixture
        shutil.copyfile(os.path.join(fixtures, arg), path)
    elif op == "value":  # TENSOR@INDEX=nan|inf|-inf|number
        target, value = arg.split("=", 1)
        tensor, index = target.rsplit("@", 1)
        set_element(path, tensor, int(index), float(value))
    elif op in ("i32", "u8", "f32"):  # OFFSET=VALUE: a little-endian int32 / byte / float32 at a byte offset
        at, value = arg.split("=", 1)
        fmt = {"i32": "<i", "u8": "<B", "f32": "<f"}[op]
        packed = struct.pack(fmt, float(value) if op == "f32" else int(value))
        open(path, "wb").write(raw[:int(at)] + packed + raw[int(at) + len(packed):])
    elif op == "nest":  # N arrays one inside another: [[[...]]]
        open(path, "wb").write(b"[" * int(arg) + b"]" * int(arg))
    elif op == "nestin":  # N=TEXT: TEXT with N nested arrays in place of its {}
        n, text = arg.split("=", 1)
        open(path, "wb").write(text.replace("{}", "[" * int(n) + "]" * int(n), 1).encode())
    elif op == "bigvalue":  # KEY=N: a JSON object whose KEY is a string of N x's
        key, n = arg.split("=", 1)
        open(path, "wb").write(json.dumps({key: "x" * int(n)}).encode())
    elif op == "lines":  # keep the first N lines of a text file
        lines = raw.decode("latin-1").split("\n")
        open(path, "wb").write("\n".join(lines[:int(arg)]).encode("latin-1") + b"\n")
    elif op == "line":  # N=TEXT: replace line N (1-based) of a text file
        n, text = arg.split("=", 1)
        lines = raw.decode("latin-1").split("\n")
        lines[int(n) - 1] = text
        open(path, "wb").write("\n".join(lines).encode("latin-1"))
    else:
        raise ValueError(f"unknown mutation {mutation}")


# --- cases ------------------------------------------------------------------------------------

def read_cases(path, n_fields):
    cases = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = [x.strip() for x in line.split(" | ")]
            if len(fields) != n_fields:
                sys.exit(f"{path}:{number}: expected {n_fields} fields, found {len(fields)}")
            cases.append((f"{os.path.basename(path)}:{number}", fields))
    return cases


def snapshot(folder):
    out = {}
    for base, _, files in os.walk(folder):
        for name in files:
            p = os.path.join(base, name)
            if os.path.islink(p):  # a link (maybe dangling) is its target's name
                out[os.path.relpath(p, folder)] = "-> " + os.readlink(p)
                continue
            if not stat.S_ISREG(os.lstat(p).st_mode):  # a FIFO (opening it would wait), a socket
                out[os.path.relpath(p, folder)] = "mode %o" % os.lstat(p).st_mode
                continue
            with open(p, "rb") as f:
                out[os.path.relpath(p, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


def run_case(xgrad, work, fixtures, timeout, where, case, missing=frozenset()):
    if len(case) == 6:
        cid, fixture, want, keys, untouched, command = case
        target, mutation = None, "none"
    else:
        cid, fixture, target, mutation, want, keys, untouched, command = case
    if fixture in missing:
        return None  # skipped: this build cannot make the fixture
    d = os.path.join(work, "cases", cid)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    run = os.path.join(d, "run")
    if fixture != "-":
        shutil.copytree(os.path.join(fixtures, fixture), run)
    if target:
        try:
            mutate(os.path.join(run, target), mutation, fixtures)
        except Exception as e:  # a broken case, not an xgrad failure, but a failure all the same
            return [f"{cid} ({where}): the mutation '{mutation}' failed: {e!r}"]
    before = snapshot(d)
    args = [a.replace("{run}", run).replace("{dir}", d) for a in shlex.split(command)]
    stdout_file = None
    if args and args[0].startswith(">"):
        stdout_file = args.pop(0)[1:]
    problems = []
    try:
        if stdout_file is None:
            r = subprocess.run([xgrad] + args, cwd=d, capture_output=True, timeout=timeout)
        else:
            with open(stdout_file, "wb") as sink:
                r = subprocess.run([xgrad] + args, cwd=d, stdout=sink, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [f"{cid} ({where}): HANG: no exit within {timeout} s: xgrad {command}"]
    err = r.stderr.decode("utf-8", "replace")
    out = (r.stdout or b"").decode("utf-8", "replace")
    if r.returncode < 0:
        problems.append(f"killed by signal {-r.returncode}")
    for m in SANITIZER_MARKERS:
        if m in err:
            problems.append(f"'{m}' in stderr")
    if r.returncode != int(want):
        problems.append(f"exit {r.returncode}, expected {want}")
    text = err if int(want) != 0 else out
    if int(want) != 0:
        lines = err.strip("\n").split("\n")
        if len(lines) != 1 or not lines[0].startswith("xgrad: "):
            problems.append(f"stderr is not one 'xgrad: ...' line")
    if keys != "-":
        for k in keys.split(","):
            if k.strip().lower() not in text.lower():
                problems.append(f"key word '{k.strip()}' missing")
    if untouched != "-":
        after = snapshot(d)
        paths = before.keys() | after.keys() if untouched == "all" else untouched.split()
        changed = [p for p in sorted(paths) if before.get(p) != after.get(p)]
        if changed:
            problems.append(f"files changed: {' '.join(changed)}")
    if problems:
        return [f"{cid} ({where}): {'; '.join(problems)}\n    xgrad {command}\n    stderr: {err.strip()[:400]}"]
    shutil.rmtree(d, ignore_errors=True)
    return []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("xgrad")
    ap.add_argument("work")
    ap.add_argument("--only", default="")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    xgrad = os.path.abspath(a.xgrad)
    work = os.path.abspath(a.work)
    shutil.rmtree(os.path.join(work, "cases"), ignore_errors=True)
    fixtures = os.path.join(work, "fixtures")
    missing = make_fixtures(xgrad, fixtures)
    cases = read_cases(os.path.join(HERE, "cli_cases.txt"), 6) + read_cases(os.path.join(HERE, "file_cases.txt"), 8)
    ids = [c[1][0] for c in cases]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        sys.exit(f"catalogue: repeated ids {sorted(dup)}")
    cases = [c for c in cases if a.only in c[1][0]]
    def timed(c):
        t0 = time.monotonic()
        r = run_case(xgrad, work, fixtures, a.timeout, c[0], c[1], missing)
        return r, time.monotonic() - t0, c[1][0]

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        timed_results = list(pool.map(timed, cases))
    results = [r for r, _, _ in timed_results]
    # The slowest cases, so a case creeping towards the timeout (a sanitizer build is ~5x slower)
    # is seen before it fails.
    slowest = sorted(timed_results, key=lambda t: -t[1])[:5]
    print("slowest cases: " + "  ".join(f"{cid} {sec:.1f} s" for _, sec, cid in slowest))
    failures = [p for r in results if r for p in r]
    skipped = sum(1 for r in results if r is None)
    n_cli = sum(1 for c in cases if len(c[1]) == 6)
    for f in failures:
        print("FAILED", f)
    note = (f", {skipped} skipped (fixtures {', '.join(sorted(missing))}: xgrad built without SentencePiece, or no "
            f"numpy)" if skipped else "")
    print(f"catalogue: {len(cases)} cases ({n_cli} CLI, {len(cases) - n_cli} file), {len(failures)} failed{note}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
