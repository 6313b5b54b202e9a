#!/usr/bin/python3
"""Fine-tune a model you have, end to end: the measurement behind docs/tutorial.md's
"Fine-tune a model you have" and the closing note of issue 32 (not a ctest test: it trains
for minutes).

Usage: /usr/bin/python3 finetune_target.py XGRAD WORKDIR [--steps 200] [--batch 8] [--lora]

1. A 1024-piece SentencePiece BPE tokenizer is trained on Debian's licence texts
   (`xgrad tokenizer train`) and written in run.c's format (`xgrad tokenizer export --format
   llama2c`).
2. A llama2.c model of stories15M's shape (dim 288, 6 layers, 6 heads, hidden 768, context
   256) with a vocabulary of 1024 and random weights (normal, std 0.02) is written here in
   llama2.c's legacy format by this script's own writer (llama2c_crosscheck.py's), then
   imported with `xgrad import llama2c`.
3. `xgrad train --init-from` fine-tunes it on the licence texts with that tokenizer; the
   validation bits per byte before (the trainer's "before training" line) and after (log.csv)
   are printed.
4. `xgrad export llama2c` writes the fine-tuned model back; this script reads the file with its
   own reader and decodes 64 tokens greedily from BOS with the float64 torch reference of the
   format (llama2c_crosscheck.py's). They must be the ids `xgrad generate` gives for the
   fine-tuned checkpoint, and xgrad's text must be the decoding of those ids by the
   tokenizer.bin rules of run.c (this script's own decoder).

Exit status: 0 all hold, 1 any fails, 77 (skip) without torch.
"""
import argparse
import csv
import json
import os
import re
import struct
import subprocess
import sys

SKIP = 77
try:
    import numpy as np
    import torch  # noqa: F401  (the reference needs it)
except ImportError:
    print("SKIPPED: python3-torch (and numpy) are not installed")
    sys.exit(SKIP)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama2c_crosscheck import legacy_bytes, reference_greedy  # noqa: E402

LICENCES = "/usr/share/common-licenses"
DIM, HIDDEN, LAYERS, HEADS, VOCAB, SEQ = 288, 768, 6, 6, 1024, 256


def sh(cmd, **kw):
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit("FAILED: exit %d" % r.returncode)
    return r.stdout, r.stderr


def random_model(rng):
    def w(*shape):
        return rng.normal(0.0, 0.02, size=shape).astype(np.float32)

    def ones():
        return np.ones(DIM, dtype=np.float32)

    L = range(LAYERS)
    m = {"dim": DIM, "hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "kv_heads": HEADS, "vocab": VOCAB,
         "seq_len": SEQ, "shared": True, "tok": w(VOCAB, DIM), "norm": ones(),
         "attention_norm": [ones() for _ in L], "ffn_norm": [ones() for _ in L],
         "wq": [w(DIM, DIM) for _ in L], "wk": [w(DIM, DIM) for _ in L], "wv": [w(DIM, DIM) for _ in L],
         "wo": [w(DIM, DIM) for _ in L], "w1": [w(HIDDEN, DIM) for _ in L], "w2": [w(DIM, HIDDEN) for _ in L],
         "w3": [w(HIDDEN, DIM) for _ in L]}
    m["output"] = m["tok"]
    return m


def read_legacy(path):
    """llama2.c's legacy model.bin: 7 int32 (dim, hidden, layers, heads, kv_heads, vocab
    (negative: an unshared classifier), seq_len), then float32 tensors in run.c's order."""
    data = open(path, "rb").read()
    dim, hidden, layers, heads, kv_heads, vocab, seq = struct.unpack_from("<7i", data, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    hs = dim // heads
    off = 28

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        a = np.frombuffer(data, dtype="<f4", count=n, offset=off).reshape(shape)
        off += 4 * n
        return a

    m = {"dim": dim, "hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv_heads, "vocab": vocab,
         "seq_len": seq, "shared": shared, "tok": take(vocab, dim)}
    L = range(layers)
    m["attention_norm"] = [take(dim) for _ in L]
    m["wq"] = [take(dim, dim) for _ in L]
    m["wk"] = [take(kv_heads * hs, dim) for _ in L]
    m["wv"] = [take(kv_heads * hs, dim) for _ in L]
    m["wo"] = [take(dim, dim) for _ in L]
    m["ffn_norm"] = [take(dim) for _ in L]
    m["w1"] = [take(hidden, dim) for _ in L]
    m["w2"] = [take(dim, hidden) for _ in L]
    m["w3"] = [take(hidden, dim) for _ in L]
    m["norm"] = take(dim)
    take(seq, hs // 2)
    take(seq, hs // 2)  # the RoPE tables (run.c ignores them; so does the reference)
    m["output"] = m["tok"] if shared else take(vocab, dim)
    if off != len(data):
        raise SystemExit("FAILED: %s has %d bytes, the header describes %d" % (path, len(data), off))
    return m


def read_tokenizer_bin(path, vocab):
    """run.c's build_tokenizer: int32 max_token_length, then per id float32 score, int32
    length, bytes."""
    data = open(path, "rb").read()
    off = 4
    pieces = []
    for _ in range(vocab):
        _score, n = struct.unpack_from("<fi", data, off)
        off += 8
        pieces.append(data[off:off + n])
        off += n
    return pieces


def decode_run_c(pieces, ids, prev=1):
    """run.c's decode(): a leading space is dropped after BOS (id 1); '<0xXX>' is that byte."""
    out = b""
    for t in ids:
        p = pieces[t]
        if prev == 1 and p.startswith(b" "):
            p = p[1:]
        mm = re.fullmatch(rb"<0x([0-9A-Fa-f]{2})>", p)
        if mm:
            p = bytes([int(mm.group(1), 16)])
        out += p
        prev = t
    return out


def val_bpb_before(stdout):
    """The trainer's line "initialised from M: <metric> <value> before training"."""
    mm = re.search(r"initialised from .*?: (\S+) ([0-9.eE+-]+) before training", stdout)
    return (mm.group(1), float(mm.group(2))) if mm else (None, None)


def last_val_bpb(run):
    with open(os.path.join(run, "log.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r.get("val_bpb")]
    return float(rows[-1]["val_bpb"]) if rows else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("xgrad")
    ap.add_argument("workdir")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lora", action="store_true", help="fine-tune with --lora-rank 8 --lora-targets all")
    a = ap.parse_args()
    x, wd = a.xgrad, a.workdir
    os.makedirs(wd, exist_ok=True)
    p = lambda name: os.path.join(wd, name)  # noqa: E731
    if not os.path.exists(p("tok.model")):
        sh([x, "tokenizer", "train", "--vocab-size", str(VOCAB), "--model-type", "bpe", "--out", p("tok.model"),
            LICENCES])
    sh([x, "tokenizer", "export", "--format", "llama2c", "--overwrite", p("tok.model"), p("tokenizer.bin")])
    with open(p("random.bin"), "wb") as f:
        f.write(legacy_bytes(random_model(np.random.default_rng(15))))
    sh([x, "import", "llama2c", "--overwrite", p("random.bin"), p("imported.safetensors")])
    run = p("lora" if a.lora else "full")
    cmd = [x, "train", "--init-from", p("imported.safetensors"), "--task", "text", "--text", LICENCES,
           "--tokenizer", p("tokenizer.bin"), "--steps", str(a.steps), "--batch", str(a.batch), "--context",
           str(SEQ), "--eval-every", str(max(1, a.steps // 2)), "--no-progress", "--no-plot", "--overwrite",
           "--out", run]
    if a.lora:
        cmd += ["--lora-rank", "8", "--lora-targets", "all"]
    out, err = sh(["/usr/bin/time", "-v"] + cmd)
    metric, before = val_bpb_before(out + err)
    after = last_val_bpb(run)
    if metric not in (None, "val_bits_per_byte"):
        print("note: the trainer's metric before training is %s, not val_bits_per_byte" % metric)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    print("val_bpb before %s after %s (peak RSS %s kB)" % (before, after, rss.group(1) if rss else "?"))
    failures = []
    if before is None or after is None or not after < before:
        failures.append("validation bits per byte did not fall: before %s after %s" % (before, after))
    sh([x, "export", "llama2c", "--overwrite", os.path.join(run, "model.safetensors"), p("finetuned.bin")])
    m = read_legacy(p("finetuned.bin"))
    ref_ids, gap = reference_greedy(m, [1], 64)
    gen, _ = sh([x, "generate", "--checkpoint", os.path.join(run, "model.safetensors"), "--prompt", "",
                 "--tokenizer", p("tokenizer.bin"), "--max-new", "64", "--json", "-"])
    g = json.loads(gen)
    ids = [int(t["id"]) for t in g["generated"]["tokens"]]
    text = g["generated"]["text"]
    print("reference ids (smallest top-2 gap %.3e): %s" % (gap, ref_ids))
    print("xgrad ids: %s" % ids)
    if ids != ref_ids:
        failures.append("greedy ids differ from the torch float64 reference")
    want = decode_run_c(read_tokenizer_bin(p("tokenizer.bin"), m["vocab"]), ref_ids).decode("utf-8", "replace")
    if text != want:
        failures.append("xgrad's text %r is not the tokenizer.bin decoding %r" % (text, want))
    for f in failures:
        print("FAIL: " + f)
    print("all hold" if not failures else "%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
