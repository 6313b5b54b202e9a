"""A tiny llama2.c tokenizer.bin and a Llama checkpoint of the same vocabulary whose greedy
output is known in advance (used by check_llama2c_generate.py and the robustness catalogue's
tbin fixture).

The tokenizer (written here from llama2.c's format: uint32 max_token_length, then per piece
float32 score, uint32 length, bytes) has 300 pieces: <unk>, "\\n<s>\\n", "\\n</s>\\n", the 256
byte pieces, then the pieces below. By hand, "Once upon" encodes to [1, 267, 274]: BOS, then
" " O n c e " " u p o n; the best merges in turn are " O" (-1), " On", " Onc", " Once" (-4),
" u" (-5), " up", " upo", " upon" (-8).

The model: `xgrad train --arch llama --no-tie-embeddings` on bytes (vocabulary 256), then
rewritten here to vocabulary 300 as a bigram machine: every block's output projections are
zero (so the final state is the token's embedding), the embedding of each chain token is a
distinct unit vector, and the classifier row of its successor points along it (logit 40, every
other 0). Chains: BOS -> " Once" -> " upon" -> " " -> <0xC3> -> <0xA9> -> BOS, and "zz" ->
EOS. Any other token has a zero embedding: all logits 0, greedy picks id 0.
"""
import json
import os
import struct
import subprocess

import numpy as np

EXTRA = [(" ", 0.0), ("O", 0.0), ("n", 0.0), ("c", 0.0), ("e", 0.0),                  # 259..263
         (" O", -1.0), (" On", -2.0), (" Onc", -3.0), (" Once", -4.0),                # 264..267
         ("u", 0.0), ("p", 0.0), ("o", 0.0),                                          # 268..270
         (" u", -5.0), (" up", -6.0), (" upo", -7.0), (" upon", -8.0),                # 271..274
         ("zz", -1.0), ("z", 0.0)]                                                    # 275, 276
VOCAB = 300
ONCE, UPON, SPACE, ZZ = 267, 274, 259, 275
BOS, EOS = 1, 2
CHAIN = [BOS, ONCE, UPON, SPACE, 0xC3 + 3, 0xA9 + 3, BOS]  # each token's successor
EOS_CHAIN = [ZZ, EOS]


def pieces():
    p = [(b"<unk>", 0.0), (b"\n<s>\n", 0.0), (b"\n</s>\n", 0.0)]
    p += [(("<0x%02X>" % b).encode(), 0.0) for b in range(256)]
    p += [(t.encode(), s) for t, s in EXTRA]
    p += [(f"filler{i}".encode(), -100.0 - i) for i in range(VOCAB - len(p))]
    assert len(p) == VOCAB
    return p


def write_tokenizer_bin(path):
    p = pieces()
    with open(path, "wb") as f:
        f.write(struct.pack("<I", max(len(t) for t, _ in p)))
        for t, s in p:
            f.write(struct.pack("<fI", s, len(t)))
            f.write(t)


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, e in header.items():
        dt = {"F32": np.float32, "F64": np.float64}[e["dtype"]]
        b, end = e["data_offsets"]
        tensors[name] = np.frombuffer(data[b:end], dtype=dt).reshape(e["shape"]).copy()
    return meta, tensors


def write_safetensors(path, meta, tensors):
    header = {"__metadata__": meta}
    blobs, at = [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        b = a.tobytes()
        header[name] = {"dtype": {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}[a.dtype],
                        "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def make_checkpoint(xgrad, folder):
    """Trains the byte-vocabulary Llama run in `folder`/byte_run and writes `folder`/bigram.safetensors
    (vocabulary 300) and `folder`/tokenizer.bin; returns the paths (byte model, bigram model, tokenizer)."""
    os.makedirs(folder, exist_ok=True)
    corpus = os.path.join(folder, "corpus")
    os.makedirs(corpus, exist_ok=True)
    for i in range(4):
        with open(os.path.join(corpus, f"s{i}.txt"), "w") as f:
            f.write(f"Once upon a time story {i} went on and on.\n" * 30)
    run = os.path.join(folder, "byte_run")
    r = subprocess.run([xgrad, "train", "--task", "text", "--text", corpus, "--tokenizer", "bytes", "--arch", "llama",
                        "--no-tie-embeddings", "--multiple-of", "16", "--d-model", "16", "--heads", "2", "--layers",
                        "1", "--context", "16", "--batch", "4", "--steps", "1", "--no-progress", "--no-plot",
                        "--threads", "1", "--out", run], capture_output=True, text=True, errors="replace",
                       timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"llama2c fixture: xgrad train failed ({r.returncode}): {r.stderr}")
    meta, t = read_safetensors(os.path.join(run, "model.safetensors"))
    d = t["tok.weight"].shape[1]
    dt = t["tok.weight"].dtype
    for name in t:
        t[name][...] = 0
        if name.endswith("norm.weight"):
            t[name][...] = 1
    emb = np.zeros((VOCAB, d), dtype=dt)
    cls = np.zeros((VOCAB, d), dtype=dt)
    feature = {}
    for chain in (CHAIN, EOS_CHAIN):
        for a, b in zip(chain, chain[1:]):
            f = feature.setdefault(a, len(feature))
            emb[a, f] = 1
            cls[b, f] = 10
    t["tok.weight"], t["classifier.weight"] = emb, cls
    meta = {k: v for k, v in meta.items() if not k.startswith("tokenizer")}
    meta["V_vocab"] = str(VOCAB)
    meta["vocabulary"] = json.dumps([f"t{i}" for i in range(VOCAB)])
    model = os.path.join(folder, "bigram.safetensors")
    write_safetensors(model, meta, t)
    tok = os.path.join(folder, "tokenizer.bin")
    write_tokenizer_bin(tok)
    return os.path.join(run, "model.safetensors"), model, tok
