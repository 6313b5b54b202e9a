#!/usr/bin/env python3
"""Checkpoint interop with PyTorch: the Python half (run by run_interop.sh).

Usage: reader_torch.py [--also-read FILE]... CHECKPOINT LOGITS_JSON [CHECKPOINT LOGITS_JSON]...

1. A plain safetensors reader (standard library struct + json, then torch.frombuffer):
   8-byte little-endian header length N, N bytes of UTF-8 JSON
   {"<name>": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
   then the data section; offsets are relative to its start. The header is checked before
   any data is trusted (length within the file, JSON object, no duplicate keys, known dtype,
   non-negative integer shape, offsets inside the data section and matching the shape, no
   overlaps, no holes or trailing bytes - the data section must be exactly covered, as the
   format specifies). Every problem raises SafetensorsError naming the file.
2. A self-test of that reader: valid files of every kind it must accept (no tensors, only
   metadata, every dtype, scalars, zero-size tensors, header order != data order, padded
   and unpadded headers) and malformed files it must reject, including corrupted copies of
   a real xgrad checkpoint.
3. An equivalent GPT written here in PyTorch (nn.Embedding, nn.LayerNorm, nn.Linear in
   torch's out x in layout, explicit causal attention with GQA by repeat_interleave, exact
   erf GELU, output tied to the token embedding). Each xgrad checkpoint is imported
   (weights transposed, W_QKV split into q/k/v, names mapped one to one, strict loading)
   and its logits for the token batches in LOGITS_JSON (written by dump_logits from the
   same file) are compared with xgrad's to TOL max abs, with the torch model run both in
   float64 (the exact reference for the stored weights) and in float32. For float64
   checkpoints the float64 torch model must also agree to TOL_F64.
4. Negative controls: importing with a known mistake (W_O not transposed; GQA grouping by
   tile instead of repeat_interleave; for float64 checkpoints also tanh-approximated GELU
   and layer-norm eps 1e-6) must move the logits by CONTROL_FACTOR x the tolerance, so a
   pass above means those details really were checked.

Prints one line per check that is worth seeing and ends with "N passed, M failed";
exit 0 if all passed, 1 otherwise, 77 ("SKIPPED: ...") if torch cannot be imported.
"""

import argparse
import json
import math
import os
import struct
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as exc:  # pragma: no cover - depends on the machine
    print(f"SKIPPED: torch is not importable by {sys.executable} ({exc}); "
          "install python3-torch or set XGRAD_TORCH_PYTHON")
    sys.exit(77)

TOL = 1e-5  # the tolerance, max abs over all logits, for every checkpoint
# float64 checkpoints (dump_logits --float64-copy): xgrad and torch both compute in float64
# from identical weights, so they must also agree to rounding level (~1e-15 observed).
TOL_F64 = 1e-10
CONTROL_FACTOR = 100  # a deliberate mistake must move some logit by 100x the tolerance

# ============================================================================ the reader


class SafetensorsError(ValueError):
    """A malformed safetensors file (or one this reader cannot represent in torch)."""


# safetensors dtype tag -> (torch dtype, bytes per element). Every tag of the format that
# torch 1.13 can hold; U16/U32/U64 and the F8 variants are valid tags but have no torch
# 1.13 dtype, so they are reported as unsupported (not as malformed).
DTYPES = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}
VALID_BUT_UNSUPPORTED = {"U16", "U32", "U64", "F8_E4M3", "F8_E5M2"}
MAX_HEADER = 100_000_000  # the reference implementation's limit


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise SafetensorsError(f"duplicate key {k!r} in a header object")
        d[k] = v
    return d


def _is_uint(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def parse_safetensors(blob, where="<bytes>"):
    """bytes -> (dict name -> torch.Tensor in data order, dict metadata)."""
    def fail(msg):
        raise SafetensorsError(f"{where}: {msg}")

    if len(blob) < 8:
        fail(f"{len(blob)} bytes, fewer than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        fail(f"header length {n} exceeds the {len(blob) - 8} bytes after it")
    if n > MAX_HEADER:
        fail(f"header length {n} exceeds the {MAX_HEADER}-byte limit")
    try:
        text = bytes(blob[8:8 + n]).decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"header is not UTF-8: {e}")
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates)
    except SafetensorsError as e:
        fail(str(e))
    except ValueError as e:
        fail(f"header is not valid JSON: {e}")
    if not isinstance(header, dict):
        fail(f"header is a JSON {type(header).__name__}, not an object")

    data = memoryview(blob)[8 + n:]
    metadata = {}
    if "__metadata__" in header:
        meta = header.pop("__metadata__")
        if not isinstance(meta, dict):
            fail("__metadata__ is not an object")
        for k, v in meta.items():
            if not isinstance(v, str):
                fail(f"__metadata__[{k!r}] is a {type(v).__name__}, not a string")
        metadata = meta

    entries = []
    for name, e in header.items():
        what = f"tensor {name!r}: "
        if not isinstance(e, dict) or not all(k in e for k in ("dtype", "shape", "data_offsets")):
            fail(what + "needs dtype, shape and data_offsets")
        tag = e["dtype"]
        if not isinstance(tag, str):
            fail(what + "dtype is not a string")
        if tag in VALID_BUT_UNSUPPORTED:
            fail(what + f"dtype {tag} has no torch {torch.__version__} equivalent (unsupported)")
        if tag not in DTYPES:
            fail(what + f"unknown dtype {tag!r}")
        shape = e["shape"]
        if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
            fail(what + f"shape {shape!r} is not a list of non-negative integers")
        off = e["data_offsets"]
        if not isinstance(off, list) or len(off) != 2 or not all(_is_uint(o) for o in off):
            fail(what + f"data_offsets {off!r} must be two non-negative integers")
        begin, end = off
        if begin > end or end > len(data):
            fail(what + f"data_offsets [{begin}, {end}] fall outside the {len(data)}-byte data section")
        count = math.prod(shape)
        need = count * DTYPES[tag][1]
        if end - begin != need:
            fail(what + f"data_offsets span {end - begin} bytes, shape {shape} of {tag} needs {need}")
        entries.append((begin, end, name, tag, shape))

    # The data section must be covered exactly: sorted by offset, each tensor starts where
    # the previous one ended, and the last one ends at the end of the file.
    entries.sort(key=lambda t: (t[0], t[1]))
    pos, prev = 0, None
    for begin, end, name, _, _ in entries:
        if begin < pos:
            fail(f"tensors {prev!r} and {name!r} overlap")
        if begin > pos:
            fail(f"{begin - pos} unreferenced bytes before tensor {name!r} (a hole in the data section)")
        pos, prev = end, name
    if pos != len(data):
        fail(f"{len(data) - pos} unreferenced bytes after the last tensor")

    if sys.byteorder != "little" and any(DTYPES[t][1] > 1 for _, _, _, t, _ in entries):
        fail("this reader needs a little-endian host")
    tensors = {}
    for begin, end, name, tag, shape in entries:
        dt = DTYPES[tag][0]
        if begin == end:
            t = torch.empty(shape, dtype=dt)
        else:
            # bytearray: a private, writable, aligned copy (frombuffer shares memory).
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=dt).reshape(shape)
        if tag == "BOOL" and t.numel() and not bool(((t.view(torch.uint8) == 0) | (t.view(torch.uint8) == 1)).all()):
            fail(f"tensor {name!r}: BOOL data holds bytes other than 0 and 1")
        tensors[name] = t
    return tensors, metadata


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    return parse_safetensors(blob, path)


# ==================================================================== the PyTorch model


class Config:
    """The model configuration from a checkpoint's __metadata__ (validated)."""

    def __init__(self, meta, where):
        def need(k):
            if k not in meta:
                raise SafetensorsError(f"{where}: metadata lacks {k!r}")
            return meta[k]

        def size(k):
            v = need(k)
            if not (v.isascii() and v.isdigit()):
                raise SafetensorsError(f"{where}: metadata {k!r} = {v!r} is not a non-negative integer")
            return int(v)

        if need("model") != "gpt":
            raise SafetensorsError(f"{where}: model {meta['model']!r} is not a decoder-only 'gpt'")
        if need("layout") != "in_x_out":
            raise SafetensorsError(f"{where}: layout {meta['layout']!r}, expected 'in_x_out'")
        self.V = size("V_vocab")
        self.context = size("context")
        self.d = size("d_model")
        self.H_q = size("H_q")
        self.H_kv = size("H_kv")
        self.d_h = size("d_h")
        self.layers = size("layers")
        self.d_ff = size("d_ff")
        self.dtype = need("dtype")
        if self.dtype not in ("float32", "float64"):
            raise SafetensorsError(f"{where}: dtype {self.dtype!r}")
        if self.H_q == 0 or self.H_kv == 0 or self.H_q % self.H_kv or self.H_q * self.d_h != self.d:
            raise SafetensorsError(f"{where}: heads H_q={self.H_q} H_kv={self.H_kv} d_h={self.d_h} "
                                   f"do not fit d_model={self.d}")
        vocab = json.loads(need("vocabulary"))
        if len(vocab) != self.V:
            raise SafetensorsError(f"{where}: V_vocab {self.V} but the vocabulary has {len(vocab)} tokens")

    def describe(self):
        return (f"V={self.V} context={self.context} d_model={self.d} H_q={self.H_q} H_kv={self.H_kv} "
                f"d_h={self.d_h} layers={self.layers} d_ff={self.d_ff} {self.dtype}")


class CausalSelfAttention(nn.Module):
    def __init__(self, c, gqa_mode="interleave"):
        super().__init__()
        self.H_q, self.H_kv, self.d_h = c.H_q, c.H_kv, c.d_h
        self.q = nn.Linear(c.d, c.H_q * c.d_h)
        self.k = nn.Linear(c.d, c.H_kv * c.d_h)
        self.v = nn.Linear(c.d, c.H_kv * c.d_h)
        self.o = nn.Linear(c.H_q * c.d_h, c.d)
        self.gqa_mode = gqa_mode  # "tile" only for the negative control

    def forward(self, x):
        B, T, _ = x.shape
        # [B, T, H d_h] -> [B, H, T, d_h]: heads split the features.
        q = self.q(x).view(B, T, self.H_q, self.d_h).transpose(1, 2)
        k = self.k(x).view(B, T, self.H_kv, self.d_h).transpose(1, 2)
        v = self.v(x).view(B, T, self.H_kv, self.d_h).transpose(1, 2)
        r = self.H_q // self.H_kv
        if r > 1:  # query head h reads kv head h // r
            if self.gqa_mode == "interleave":
                k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
            else:
                k, v = k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d_h)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        y = (weights @ v).transpose(1, 2).reshape(B, T, self.H_q * self.d_h)
        return self.o(y)


class Block(nn.Module):
    def __init__(self, c, gqa_mode, gelu, ln_eps):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.d, eps=ln_eps)
        self.attn = CausalSelfAttention(c, gqa_mode)
        self.ln2 = nn.LayerNorm(c.d, eps=ln_eps)
        self.fc1 = nn.Linear(c.d, c.d_ff)
        self.fc2 = nn.Linear(c.d_ff, c.d)
        self.gelu = gelu  # "none" = exact erf GELU (xgrad's); "tanh" only for a control

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate=self.gelu))


class TorchGPT(nn.Module):
    def __init__(self, c, gqa_mode="interleave", gelu="none", ln_eps=1e-5):
        super().__init__()
        self.context = c.context
        self.tok = nn.Embedding(c.V, c.d)
        self.pos = nn.Embedding(c.context, c.d)
        self.blocks = nn.ModuleList(Block(c, gqa_mode, gelu, ln_eps) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d, eps=ln_eps)

    def forward(self, tokens):
        T = tokens.shape[1]
        assert T <= self.context
        h = self.tok(tokens) + self.pos(torch.arange(T))
        for b in self.blocks:
            h = b(h)
        return F.linear(self.ln_f(h), self.tok.weight)  # tied output embedding, no bias


def torch_state_dict(tensors, c, where, transpose_W_O=True):
    """xgrad parameters (in x out) -> TorchGPT state dict (out x in). Every xgrad tensor
    must be used exactly once and have the shape the configuration implies."""
    used = set()

    def take(name, shape):
        if name not in tensors:
            raise SafetensorsError(f"{where}: parameter {name!r} is missing")
        t = tensors[name]
        if list(t.shape) != list(shape):
            raise SafetensorsError(f"{where}: {name!r} has shape {list(t.shape)}, expected {list(shape)}")
        want = torch.float32 if c.dtype == "float32" else torch.float64
        if t.dtype != want:
            raise SafetensorsError(f"{where}: {name!r} is {t.dtype}, metadata says {c.dtype}")
        used.add(name)
        return t

    qd, kd = c.H_q * c.d_h, c.H_kv * c.d_h
    sd = {
        "tok.weight": take("tok.weight", [c.V, c.d]),
        "pos.weight": take("pos.weight", [c.context, c.d]),
        "ln_f.weight": take("ln_f.gamma", [c.d]),
        "ln_f.bias": take("ln_f.beta", [c.d]),
    }
    for l in range(c.layers):
        x, p = f"blocks.{l}.", f"blocks.{l}."
        for ln in ("ln1", "ln2"):
            sd[p + ln + ".weight"] = take(x + ln + ".gamma", [c.d])
            sd[p + ln + ".bias"] = take(x + ln + ".beta", [c.d])
        W = take(x + "attn.W_QKV", [c.d, qd + 2 * kd]).t()  # -> [(H_q + 2 H_kv) d_h, d]
        b = take(x + "attn.b_QKV", [qd + 2 * kd])
        # Columns (now rows) [Q heads | K heads | V heads], head-major inside each block,
        # which is exactly what view(B, T, H, d_h) expects of each projection.
        sd[p + "attn.q.weight"], sd[p + "attn.k.weight"], sd[p + "attn.v.weight"] = W.split([qd, kd, kd], 0)
        sd[p + "attn.q.bias"], sd[p + "attn.k.bias"], sd[p + "attn.v.bias"] = b.split([qd, kd, kd], 0)
        W_O = take(x + "attn.W_O", [qd, c.d])
        sd[p + "attn.o.weight"] = W_O.t() if transpose_W_O else W_O.reshape(c.d, qd)
        sd[p + "attn.o.bias"] = take(x + "attn.b_O", [c.d])
        sd[p + "fc1.weight"] = take(x + "ffn.fc1.W", [c.d, c.d_ff]).t()
        sd[p + "fc1.bias"] = take(x + "ffn.fc1.b", [c.d_ff])
        sd[p + "fc2.weight"] = take(x + "ffn.fc2.W", [c.d_ff, c.d]).t()
        sd[p + "fc2.bias"] = take(x + "ffn.fc2.b", [c.d])
    extra = sorted(set(tensors) - used)
    if extra:
        raise SafetensorsError(f"{where}: tensors that are not parameters of the model: {extra}")
    return {k: v.contiguous() for k, v in sd.items()}


def build_model(tensors, c, where, dtype, transpose_W_O=True, **model_kw):
    m = TorchGPT(c, **model_kw)
    sd = torch_state_dict(tensors, c, where, transpose_W_O)
    m.load_state_dict(sd, strict=True)
    return m.to(dtype).eval()


def json_tensor(a, dtype):
    t = torch.tensor(a["data"], dtype=dtype)
    if t.numel() != math.prod(a["shape"]):
        raise ValueError(f"JSON array: shape {a['shape']} but {t.numel()} values")
    return t.reshape(a["shape"])


# ======================================================================= the checks


class Tally:
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, ok, line, quiet_ok=False):
        if ok:
            self.passed += 1
            if not quiet_ok:
                print(f"  ok    {line}")
        else:
            self.failed += 1
            print(f"  FAIL  {line}")


def st_bytes(tensors, metadata=None, pad=True, order=None, raw_header=None):
    """Writes a safetensors blob: tensors is a list of (name, tag, shape, data bytes)."""
    header, off, data = {}, 0, b""
    for name, tag, shape, payload in tensors:
        header[name] = {"dtype": tag, "shape": shape, "data_offsets": [off, off + len(payload)]}
        off += len(payload)
        data += payload
    if order is not None:
        header = {k: header[k] for k in order}
    if metadata is not None:
        header["__metadata__"] = metadata
    text = (raw_header if raw_header is not None else json.dumps(header)).encode("utf-8")
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def reader_self_test(tally, real_file):
    print("reader self-test (valid files must be accepted with exact values, malformed ones rejected):")
    f64 = [1.0, -2.5, 1e-300, math.pi]
    f32 = [0.5, -3.25, 1e30, 7.0, -0.0, 2.0]
    bf16_vals = [1.5, -2.0, 0.15625]
    bf16 = b"".join(struct.pack("<f", v)[2:] for v in bf16_vals)  # exactly representable
    every = [
        ("b_f32", "F32", [2, 3], struct.pack("<6f", *f32)),
        ("a_f64", "F64", [4], struct.pack("<4d", *f64)),
        ("c_f16", "F16", [3], struct.pack("<3e", 1.0, -0.5, 65504.0)),
        ("d_bf16", "BF16", [3], bf16),
        ("e_i64", "I64", [2], struct.pack("<2q", -(2**62), 2**62)),
        ("f_i32", "I32", [1, 2], struct.pack("<2i", -7, 2**31 - 1)),
        ("g_i16", "I16", [2], struct.pack("<2h", -32768, 123)),
        ("h_u8", "U8", [3], bytes([0, 128, 255])),  # 3 bytes: the next tensor is unaligned
        ("i_i8", "I8", [2], struct.pack("<2b", -128, 127)),
        ("j_bool", "BOOL", [2], bytes([1, 0])),
        ("k_scalar", "F64", [], struct.pack("<d", 42.0)),
        ("l_empty", "F32", [0, 5], b""),
        ("m_after_empty", "F64", [1], struct.pack("<d", -1.0)),
    ]
    expect = {
        "b_f32": torch.tensor(f32, dtype=torch.float32).reshape(2, 3),
        "a_f64": torch.tensor(f64, dtype=torch.float64),
        "c_f16": torch.tensor([1.0, -0.5, 65504.0], dtype=torch.float16),
        "d_bf16": torch.tensor(bf16_vals, dtype=torch.bfloat16),
        "e_i64": torch.tensor([-(2**62), 2**62], dtype=torch.int64),
        "f_i32": torch.tensor([[-7, 2**31 - 1]], dtype=torch.int32),
        "g_i16": torch.tensor([-32768, 123], dtype=torch.int16),
        "h_u8": torch.tensor([0, 128, 255], dtype=torch.uint8),
        "i_i8": torch.tensor([-128, 127], dtype=torch.int8),
        "j_bool": torch.tensor([True, False]),
        "k_scalar": torch.tensor(42.0, dtype=torch.float64),
        "l_empty": torch.empty(0, 5, dtype=torch.float32),
        "m_after_empty": torch.tensor([-1.0], dtype=torch.float64),
    }
    names = [t[0] for t in every]
    valid = [
        ("no tensors, no metadata", st_bytes([]), {}, {}),
        ("no tensors, unpadded header", st_bytes([], pad=False), {}, {}),
        ("metadata only", st_bytes([], {"k": "v", "empty": ""}), {}, {"k": "v", "empty": ""}),
        ("every dtype, scalar, zero-size, unaligned", st_bytes(every), expect, {}),
        ("header order reversed vs data order", st_bytes(every, order=names[::-1]), expect, {}),
        ("unpadded header + unicode metadata", st_bytes(every, {"naïve": "∑ 1/n²"}, pad=False),
         expect, {"naïve": "∑ 1/n²"}),
        ("zero-size tensors only",
         st_bytes([("z", "F64", [0], b""), ("y", "I32", [3, 0, 2], b"")]),
         {"z": torch.empty(0, dtype=torch.float64), "y": torch.empty(3, 0, 2, dtype=torch.int32)}, {}),
    ]
    for label, blob, want, want_meta in valid:
        try:
            got, meta = parse_safetensors(blob, label)
            same = set(got) == set(want) and meta == want_meta and all(
                got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and torch.equal(got[k], want[k])
                for k in want)
            tally.check(same, f"accepts {label}: values {'exact' if same else 'DIFFER'}", quiet_ok=True)
        except Exception as e:  # noqa: BLE001 - any exception is a failure here
            tally.check(False, f"rejected a valid file ({label}): {type(e).__name__}: {e}")

    good = [("w", "F32", [2], struct.pack("<2f", 1, 2)), ("u", "F64", [1], struct.pack("<d", 3))]
    good_blob = st_bytes(good)

    def with_header(h, data=b"\0" * 16, pad=True):
        return st_bytes([], raw_header=json.dumps(h), pad=pad) + data

    def entry(tag="F32", shape=(2,), off=(0, 8)):
        return {"dtype": tag, "shape": list(shape), "data_offsets": list(off)}

    bad = [
        ("empty file", b""),
        ("7-byte file", b"\x00" * 7),
        ("header length past the end", struct.pack("<Q", 100) + b"{}"),
        ("header length 2^64-1", struct.pack("<Q", 2**64 - 1) + b"{}"),
        ("header not UTF-8", struct.pack("<Q", 4) + b"{\xff}\x20"),
        ("header not JSON", struct.pack("<Q", 8) + b"{'a': 1}"),
        ("header a JSON list", st_bytes([], raw_header="[]")),
        ("duplicate tensor name",
         st_bytes([], raw_header='{"a": %s, "a": %s}' % (json.dumps(entry()), json.dumps(entry(off=(8, 16)))))
         + b"\0" * 16),
        ("entry not an object", with_header({"a": [1, 2]})),
        ("entry lacks data_offsets", with_header({"a": {"dtype": "F32", "shape": [2]}})),
        ("entry lacks dtype", with_header({"a": {"shape": [2], "data_offsets": [0, 8]}})),
        ("unknown dtype", with_header({"a": entry(tag="F128", shape=(1,), off=(0, 16))})),
        ("dtype not a string", with_header({"a": entry(tag=4)})),
        ("valid but unsupported dtype U32", with_header({"a": entry(tag="U32", shape=(4,), off=(0, 16))})),
        ("negative shape", with_header({"a": entry(shape=(-2,))})),
        ("fractional shape", with_header({"a": entry(shape=(2.0,))})),
        ("boolean shape entry", with_header({"a": entry(shape=(True, 2))})),
        ("shape not a list", with_header({"a": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})),
        ("one data offset", with_header({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8]}})),
        ("negative data offset", with_header({"a": entry(off=(-8, 0))})),
        ("begin after end", with_header({"a": entry(shape=(0,), off=(8, 0))})),
        ("end past the data section", with_header({"a": entry(shape=(6,), off=(0, 24))})),
        ("span does not match shape", with_header({"a": entry(shape=(3,), off=(0, 8))}, data=b"\0" * 8)),
        ("overlapping tensors", with_header({"a": entry(shape=(4,), off=(0, 16)), "b": entry(off=(8, 16))})),
        ("hole between tensors", with_header({"a": entry(off=(0, 8)), "b": entry(shape=(1,), off=(12, 16))})),
        ("trailing bytes after the data", good_blob + b"\0\0\0\0"),
        ("truncated data", good_blob[:-1]),
        ("__metadata__ not an object", with_header({"__metadata__": ["x"]}, data=b"")),
        ("metadata value not a string", with_header({"__metadata__": {"step": 40}}, data=b"")),
        ("BOOL byte 2", st_bytes([("b", "BOOL", [2], bytes([1, 2]))])),
    ]
    if real_file:
        with open(real_file, "rb") as f:
            real = f.read()
        (n,) = struct.unpack("<Q", real[:8])
        head = json.loads(real[8:8 + n])
        name = next(k for k in head if k != "__metadata__")
        shifted = dict(head)
        shifted[name] = dict(head[name], data_offsets=[o + 4 for o in head[name]["data_offsets"]])
        shifted_text = json.dumps(shifted).encode()
        shifted_text += b" " * ((8 - len(shifted_text) % 8) % 8)
        bad += [
            ("real checkpoint cut by one byte", real[:-1]),
            ("real checkpoint cut inside the header", real[:8 + n // 2]),
            ("real checkpoint, header length + 8", struct.pack("<Q", n + 8) + real[8:]),
            ("real checkpoint, header length - 1", struct.pack("<Q", n - 1) + real[8:]),
            (f"real checkpoint, {name} offsets + 4", struct.pack("<Q", len(shifted_text)) + shifted_text
             + real[8 + n:]),
        ]
        try:
            parse_safetensors(real, real_file)
            tally.check(True, "accepts the real checkpoint unchanged", quiet_ok=True)
        except Exception as e:  # noqa: BLE001
            tally.check(False, f"rejected the real checkpoint: {type(e).__name__}: {e}")
    for label, blob in bad:
        try:
            parse_safetensors(blob, label)
            tally.check(False, f"accepted a malformed file: {label}")
        except SafetensorsError as e:
            tally.check(True, f"rejects {label}: {e}", quiet_ok=True)
        except Exception as e:  # noqa: BLE001 - must fail loudly, but with a clear error
            tally.check(False, f"{label}: raised {type(e).__name__} instead of SafetensorsError: {e}")
    print(f"  {len(valid)} valid files accepted and {len(bad)} malformed files checked "
          f"({tally.failed} failure(s) so far)")


def compare_checkpoint(tally, ckpt, logits_json, worst):
    label = os.path.basename(os.path.dirname(os.path.abspath(ckpt))) or ckpt
    tensors, meta = read_safetensors(ckpt)
    c = Config(meta, ckpt)
    print(f"{label}: {ckpt}\n  {c.describe()}, {len(tensors)} tensors")
    with open(logits_json) as f:
        dump = json.load(f)
    if dump["V_vocab"] != c.V or dump["context"] != c.context or dump["dtype"] != c.dtype:
        tally.check(False, f"{label}: {logits_json} does not describe {ckpt}")
        return
    m64 = build_model(tensors, c, ckpt, torch.float64)
    m32 = build_model(tensors, c, ckpt, torch.float32)
    with torch.no_grad():
        for i, case in enumerate(dump["cases"]):
            tokens = json_tensor(case["tokens"], torch.int64)
            ref = json_tensor(case["logits"], torch.float64)
            B, T = tokens.shape
            if list(ref.shape) != [B, T, c.V]:
                tally.check(False, f"{label} case {i}: logits shape {list(ref.shape)} != {[B, T, c.V]}")
                continue
            e64 = (m64(tokens) - ref).abs().max().item()
            e32 = (m32(tokens).double() - ref).abs().max().item()
            for k, e in (("torch64", e64), ("torch32", e32)):
                worst[(c.dtype, k)] = max(worst.get((c.dtype, k), 0.0), e)
            scale = ref.abs().max().item()
            ok = e64 <= TOL and e32 <= TOL and (c.dtype == "float32" or e64 <= TOL_F64)
            tight = f"; torch64 tol {TOL_F64:g}" if c.dtype == "float64" else ""
            tally.check(ok, f"{label} case {i} [B={B}, T={T}]: max|xgrad - torch64| = {e64:.2e}, "
                        f"max|xgrad - torch32| = {e32:.2e} (max|logit| = {scale:.3g}, tol {TOL:g}{tight})")

        # Negative controls on the longest case.
        case = max(dump["cases"], key=lambda k: k["tokens"]["shape"][1])
        tokens = json_tensor(case["tokens"], torch.int64)
        ref = json_tensor(case["logits"], torch.float64)
        controls = [("W_O not transposed", dict(transpose_W_O=False))]
        if 1 < c.H_kv < c.H_q:  # with H_kv == 1 or H_kv == H_q tile and interleave coincide
            controls.append(("GQA grouping by tile instead of repeat_interleave", dict(gqa_mode="tile")))
        if c.dtype == "float64":  # too subtle for float32 rounding to show reliably
            controls += [("tanh GELU instead of erf", dict(gelu="tanh")), ("layer-norm eps 1e-6", dict(ln_eps=1e-6))]
        need = CONTROL_FACTOR * (TOL_F64 if c.dtype == "float64" else TOL)
        for what, kw in controls:
            d = (build_model(tensors, c, ckpt, torch.float64, **kw)(tokens) - ref).abs().max().item()
            tally.check(d >= need, f"{label} control, {what}: max|diff| = {d:.2e} "
                        f"(must be >= {need:g}, else the comparison could not see the mistake)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--also-read", action="append", default=[], metavar="FILE",
                    help="another safetensors file that must read cleanly")
    ap.add_argument("pairs", nargs="+", metavar="CHECKPOINT LOGITS_JSON")
    a = ap.parse_args()
    if len(a.pairs) % 2:
        ap.error("checkpoints and logit dumps come in pairs")
    pairs = list(zip(a.pairs[0::2], a.pairs[1::2]))
    print(f"torch {torch.__version__} ({sys.executable}), tolerance {TOL:g} max abs")

    tally = Tally()
    reader_self_test(tally, pairs[0][0])
    for path in a.also_read:
        try:
            tensors, meta = read_safetensors(path)
            tally.check(True, f"reads {path}: {len(tensors)} tensors, {len(meta)} metadata keys")
        except SafetensorsError as e:
            tally.check(False, f"could not read {path}: {e}")

    worst = {}
    for ckpt, logits_json in pairs:
        try:
            compare_checkpoint(tally, ckpt, logits_json, worst)
        except (SafetensorsError, OSError, ValueError, KeyError, RuntimeError) as e:
            tally.check(False, f"{ckpt}: {type(e).__name__}: {e}")
    print("largest max|xgrad - torch| over all cases: " + ", ".join(
        f"{dt} checkpoints vs {k} {e:.3e}" for (dt, k), e in sorted(worst.items())))
    print(f"{tally.passed} passed, {tally.failed} failed")
    return 0 if tally.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
