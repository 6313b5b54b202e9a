#!/usr/bin/python3
"""llama2.c checkpoints into xgrad, checked against torch float64.

Usage: /usr/bin/python3 llama2c_crosscheck.py XGRAD DUMP_LLAMA2C

For each case this script draws a random small Llama model in llama2.c's own tensors (out x in,
PyTorch's Linear layout: wq, wk, wv, wo, w1, w2, w3, the norms, the token embedding and, when not
shared, the classifier) and writes it as llama2.c's export.py does (its own writer, below): the
legacy format (7 int32, a negative vocab_size for an unshared classifier, run.c's order, the RoPE
tables freq_cis_real / freq_cis_imag computed as export.py does in float32), version 1 (magic
"ak42", version 1, the header ints, shared_classifier, zeros to 256 bytes, export.py's order)
or version 2 (the same with the group size, int8 values and float32 scales).

Then `xgrad import llama2c` makes a checkpoint, and dump_llama2c loads it as `xgrad generate` does
and writes its logits at every position of a token sequence (the float32 model as imported, and
the same weights in float64), and its greedy continuation of a prompt by 64 tokens (with and
without the KV cache). The reference is a torch float64 Llama written from the published
architecture (rms_norm and rope from llama_model_crosscheck.py) over llama2.c's tensors, with
y = x W^T, grouped-query attention by repeating K/V heads, RoPE on interleaved pairs with base
10000, eps 1e-5. The float64 logits must agree within 1e-10 and the float32 ones within 1e-4,
relative to max(1, |torch|); the greedy ids must be the reference's (every step's top-2 gap is
reported; a gap under 1e-3 would make the comparison meaningless and fails the case).

Version 2 (int8 Q8_0, quantized here as export.py does) is checked the same way against the
reference run with the dequantized weights (q * scale in float32, as runq.c).

Finally `xgrad export llama2c` must give back a legacy input byte for byte; a version-1 or 2
input comes back as a legacy file whose weights are byte for byte those of the input (for
version 2: the dequantized values) and whose RoPE tables are within 2 ulp of the float64 cos
and sin.

Exit status: 0 all pass, 1 any fails, 77 (skip) without torch.
"""
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIPPED: python3-torch (and numpy) are not installed")
    sys.exit(SKIP)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model_crosscheck import rms_norm, rope  # noqa: E402

TOL = 1e-10
TOL32 = 1e-4
MAX_NEW = 64


def random_model(rng, dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared):
    hs = dim // heads

    def w(*shape):
        return rng.normal(0.0, 0.3, size=shape).astype(np.float32)

    def gain():
        return rng.uniform(0.5, 1.5, size=(dim,)).astype(np.float32)

    m = {"dim": dim, "hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv_heads, "vocab": vocab,
         "seq_len": seq_len, "shared": shared,
         "tok": w(vocab, dim), "norm": gain(),
         "attention_norm": [gain() for _ in range(layers)], "ffn_norm": [gain() for _ in range(layers)],
         "wq": [w(dim, dim) for _ in range(layers)], "wk": [w(kv_heads * hs, dim) for _ in range(layers)],
         "wv": [w(kv_heads * hs, dim) for _ in range(layers)], "wo": [w(dim, dim) for _ in range(layers)],
         "w1": [w(hidden, dim) for _ in range(layers)], "w2": [w(dim, hidden) for _ in range(layers)],
         "w3": [w(hidden, dim) for _ in range(layers)]}
    m["output"] = m["tok"] if shared else w(vocab, dim)
    return m


def freqs_export_py(head_size, seq_len):
    """export.py / model.py's precompute_freqs_cis, in float32 as torch computes it."""
    freqs = 1.0 / (10000.0 ** (torch.arange(0, head_size, 2)[: (head_size // 2)].float() / head_size))
    t = torch.arange(seq_len)
    freqs = torch.outer(t, freqs).float()
    return torch.cos(freqs).numpy(), torch.sin(freqs).numpy()


def f32(a):
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def header_ints(m, vocab):
    return struct.pack("<7i", m["dim"], m["hidden"], m["layers"], m["heads"], m["kv_heads"], vocab, m["seq_len"])


def legacy_weights(m, tables):
    L = range(m["layers"])
    parts = [m["tok"]]
    for name in ("attention_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3"):
        parts += [m[name][i] for i in L]
    parts.append(m["norm"])
    parts += list(tables)
    if not m["shared"]:
        parts.append(m["output"])
    return b"".join(f32(p) for p in parts)


def legacy_bytes(m):
    tables = freqs_export_py(m["dim"] // m["heads"], m["seq_len"])
    return header_ints(m, m["vocab"] if m["shared"] else -m["vocab"]) + legacy_weights(m, tables)


def version1_bytes(m):
    L = range(m["layers"])
    head = struct.pack("<Ii", 0x616B3432, 1) + header_ints(m, m["vocab"]) + struct.pack("<B", int(m["shared"]))
    head += b"\0" * (256 - len(head))
    parts = [m["attention_norm"][i] for i in L] + [m["ffn_norm"][i] for i in L] + [m["norm"], m["tok"]]
    for name in ("wq", "wk", "wv", "wo", "w1", "w2", "w3"):
        parts += [m[name][i] for i in L]
    if not m["shared"]:
        parts.append(m["output"])
    return head + b"".join(f32(p) for p in parts)


def quantize_q80(m):
    """export.py's version2_export: the group size halved from 64 until it divides dim; every
    tensor but the norms as int8 values round(w / scale), scale = max |w| / 127 per group. The
    model's weights become the dequantized values (q * scale in float32), as runq.c computes
    with them. Returns the file's bytes."""
    gs = 64
    while m["dim"] % gs:
        gs //= 2
    L = range(m["layers"])
    names = ["tok"] + [(n, i) for n in ("wq", "wk", "wv", "wo", "w1", "w2", "w3") for i in L]
    if not m["shared"]:
        names.append("output")
    head = struct.pack("<Ii", 0x616B3432, 2) + header_ints(m, m["vocab"]) + struct.pack("<B", int(m["shared"]))
    head += struct.pack("<i", gs)
    head += b"\0" * (256 - len(head))
    parts = [f32(m["attention_norm"][i]) for i in L] + [f32(m["ffn_norm"][i]) for i in L] + [f32(m["norm"])]
    for key in names:
        w = m[key] if isinstance(key, str) else m[key[0]][key[1]]
        g = w.reshape(-1, gs).astype(np.float32)
        scale = (np.abs(g).max(axis=1) / np.float32(127.0)).astype(np.float32)
        q = np.round(g / scale[:, None]).astype(np.int8)
        parts.append(q.tobytes() + f32(scale))
        deq = (q.astype(np.float32) * scale[:, None]).astype(np.float32).reshape(w.shape)
        if isinstance(key, str):
            m[key] = deq
        else:
            m[key[0]][key[1]] = deq
    if m["shared"]:
        m["output"] = m["tok"]
    return head + b"".join(parts)


def reference_logits(m, tokens):
    """torch float64 Llama over llama2.c's tensors (out x in: y = x W^T); tokens [T]."""
    t = lambda a: torch.tensor(np.asarray(a, dtype=np.float64))  # noqa: E731
    T = len(tokens)
    dim, H, Hkv = m["dim"], m["heads"], m["kv_heads"]
    hs = dim // H
    cfg = {"rope_base": 10000.0, "rope_fraction": 1.0, "rope_layout": "interleaved"}
    eps = 1e-5
    i = torch.arange(T).unsqueeze(1)
    j = torch.arange(T).unsqueeze(0)
    visible = j <= i
    h = t(m["tok"])[torch.tensor(tokens)].unsqueeze(0)  # [1, T, dim]
    for layer in range(m["layers"]):
        x = rms_norm(h, t(m["attention_norm"][layer]), eps)
        q = (x @ t(m["wq"][layer]).T).reshape(1, T, H, hs).transpose(1, 2)
        k = (x @ t(m["wk"][layer]).T).reshape(1, T, Hkv, hs).transpose(1, 2)
        v = (x @ t(m["wv"][layer]).T).reshape(1, T, Hkv, hs).transpose(1, 2)
        q, k = rope(q, cfg), rope(k, cfg)
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
        scores = (q @ k.transpose(-1, -2) / hs ** 0.5).masked_fill(~visible, float("-inf"))
        o = torch.softmax(scores, dim=-1) @ v
        h = h + o.transpose(1, 2).reshape(1, T, dim) @ t(m["wo"][layer]).T
        x = rms_norm(h, t(m["ffn_norm"][layer]), eps)
        h = h + (F.silu(x @ t(m["w1"][layer]).T) * (x @ t(m["w3"][layer]).T)) @ t(m["w2"][layer]).T
    return (rms_norm(h, t(m["norm"]), eps) @ t(m["output"]).T)[0]  # [T, vocab]


def reference_greedy(m, prompt, n):
    seq, gaps = list(prompt), []
    for _ in range(n):
        last = reference_logits(m, seq)[-1]
        top = torch.topk(last, 2).values
        gaps.append((top[0] - top[1]).item())
        seq.append(int(torch.argmax(last)))
    return seq[len(prompt):], min(gaps)


def rel_err(mine, ref):
    return ((mine - ref).abs() / ref.abs().clamp(min=1.0)).max().item()


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


def check_case(n, spec, xgrad, dump, tmp, failures, worst):
    fmt, shared = spec["format"], spec["shared"]
    tag = (f"case {n} ({fmt}, {'tied' if shared else 'untied'}, n_heads {spec['heads']}, "
           f"n_kv_heads {spec['kv_heads']})")
    rng = np.random.default_rng(20261221 + n)
    m = random_model(rng, spec["dim"], spec["hidden"], spec["layers"], spec["heads"], spec["kv_heads"],
                     spec["vocab"], spec["seq_len"], shared)
    data = {"legacy": legacy_bytes, "version1": version1_bytes, "version2": quantize_q80}[fmt](m)
    binp, ckpt, back, dumpp = (os.path.join(tmp, f"{n}.{e}") for e in ("bin", "safetensors", "out.bin", "json"))
    with open(binp, "wb") as f:
        f.write(data)
    rc, out = run([xgrad, "import", "llama2c", binp, ckpt])
    if rc != 0:
        failures.append(f"{tag}: xgrad import exited {rc}: {out}")
        return
    tokens = [int(x) for x in rng.integers(0, spec["vocab"], size=spec["seq_len"])]
    prompt = tokens[:4]
    rc, out = run([dump, ckpt, dumpp, ",".join(map(str, tokens)), str(len(prompt)), str(MAX_NEW)])
    if rc != 0:
        failures.append(f"{tag}: dump_llama2c exited {rc}: {out}")
        return
    import json
    with open(dumpp) as f:
        d = json.load(f)
    ref = reference_logits(m, tokens)
    V = spec["vocab"]
    e64 = rel_err(torch.tensor(d["logits_f64"]["data"], dtype=torch.float64).reshape(-1, V), ref)
    e32 = rel_err(torch.tensor(d["logits_f32"]["data"], dtype=torch.float64).reshape(-1, V), ref)
    worst[0], worst[1] = max(worst[0], e64), max(worst[1], e32)
    if d["dtype"] != "float32":
        failures.append(f"{tag}: the imported model is {d['dtype']}, not float32")
    if not e64 <= TOL:
        failures.append(f"{tag}: float64 logits: max rel error {e64:.3e} > {TOL}")
    if not e32 <= TOL32:
        failures.append(f"{tag}: float32 logits: max rel error {e32:.3e} > {TOL32}")
    # Greedy decoding from the prompt. The float64 reference decodes in full; tokens past the
    # prompt are the model's own, so the 64 steps test the cached path too.
    want, gap = reference_greedy(m, prompt, MAX_NEW)
    if gap < 1e-3:
        failures.append(f"{tag}: the reference's top-2 gap {gap:.2e} is too small to compare greedy ids")
    for key in ("greedy", "greedy_no_cache"):
        if d[key] != want:
            failures.append(f"{tag}: {key} ids {d[key]} differ from the reference's {want}")
    # Export: a legacy input comes back byte for byte.
    rc, out = run([xgrad, "export", "llama2c", ckpt, back])
    if rc != 0:
        failures.append(f"{tag}: xgrad export exited {rc}: {out}")
        return
    with open(back, "rb") as f:
        got = f.read()
    if fmt == "legacy":
        if got != data:
            first = next((i for i in range(min(len(got), len(data))) if got[i] != data[i]), min(len(got), len(data)))
            failures.append(f"{tag}: export gave {len(got)} bytes, the input has {len(data)}; first difference "
                            f"at byte {first}")
    else:
        hs, T = m["dim"] // m["heads"], m["seq_len"]
        own = legacy_bytes(m)
        # The tables sit between the final norm and the classifier: compare the rest exactly.
        nt = 4 * T * hs  # both tables, in bytes
        tail = 0 if shared else 4 * V * m["dim"]
        split = len(own) - tail - nt
        if len(got) != len(own) or got[:split] != own[:split] or got[split + nt:] != own[split + nt:]:
            failures.append(f"{tag}: the exported legacy file's header or weights are not the input's")
        else:
            tab = np.frombuffer(got[split:split + nt], dtype="<f4").astype(np.float64).reshape(2, T, hs // 2)
            ang = np.outer(np.arange(T), 1.0 / (10000.0 ** (np.arange(0, hs, 2) / hs)))
            err = max(np.abs(tab[0] - np.cos(ang)).max(), np.abs(tab[1] - np.sin(ang)).max())
            # float32 rounding of the frequencies and angles: 2 ulp of the angle at the last position.
            bound = 4 * np.spacing(np.float32(T)) + 1e-6
            if not err <= bound:
                failures.append(f"{tag}: exported RoPE tables differ from cos/sin by {err:.2e} > {bound:.2e}")
    print(f"{tag}: logits float64 {e64:.2e}, float32 {e32:.2e}; greedy {MAX_NEW} ids "
          f"{'match' if d['greedy'] == want else 'DIFFER'} (min top-2 gap {gap:.3f})")


def main():
    if len(sys.argv) != 3:
        print("usage: llama2c_crosscheck.py XGRAD DUMP_LLAMA2C")
        return 2
    xgrad, dump = sys.argv[1], sys.argv[2]
    base = {"dim": 48, "hidden": 80, "layers": 2, "vocab": 61, "seq_len": 72}
    cases = [
        dict(base, format="legacy", shared=True, heads=6, kv_heads=2),    # GQA, tied
        dict(base, format="legacy", shared=False, heads=6, kv_heads=3),   # GQA, untied
        dict(base, format="version1", shared=True, heads=4, kv_heads=1),  # MQA, tied
        dict(base, format="version1", shared=False, heads=6, kv_heads=2), # GQA, untied
        dict(base, format="legacy", shared=True, heads=3, kv_heads=3, layers=3),  # MHA, 3 layers
        dict(base, format="version2", shared=True, heads=6, kv_heads=2),  # int8 Q8_0, GQA, tied
        dict(base, format="version2", shared=False, heads=4, kv_heads=2), # int8 Q8_0, GQA, untied
    ]
    failures, worst = [], [0.0, 0.0]
    with tempfile.TemporaryDirectory(prefix="xgrad_llama2c_") as tmp:
        for n, spec in enumerate(cases):
            check_case(n, spec, xgrad, dump, tmp, failures, worst)
    for line in failures:
        print("FAILED:", line)
    print(f"llama2.c import cross-check: {len(cases)} cases, max error float64 {worst[0]:.3e}, "
          f"float32 {worst[1]:.3e}, {'FAILED' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
