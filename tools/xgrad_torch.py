#!/usr/bin/python3
"""xgrad <-> PyTorch: xgrad checkpoints as torch modules, and back.

An xgrad checkpoint (model.safetensors, written by `xgrad train`) holds the parameters of a
GPT (decoder-only) or an encoder-decoder model, in xgrad's layout (Linear weights in x out,
y = x W + b), and in its __metadata__ everything needed to rebuild the model. This module
builds the same models in PyTorch (torch.nn.Linear weights out x in, y = x W^T + b):

    import sys; sys.path.insert(0, "tools")     # from the xgrad source folder
    import xgrad_torch
    model = xgrad_torch.load_checkpoint("out/model.safetensors")  # eval mode, checkpoint dtype
    logits = model(tokens)                      # GPT: tokens [B, T] int64 -> [B, T, V]
    logits = model(src, src_lengths, tgt)       # encoder-decoder
    ...train it in torch...
    xgrad_torch.save_checkpoint(model, "tuned/model.safetensors")   # xgrad generate/inspect load it

A model can also start in torch: XgradGPT(Config(kind="gpt", V_vocab=..., ...)) or
XgradEncoderDecoder(Config(kind="encoder_decoder", ...)), with the vocabulary xgrad generate
should use. The computation matches xgrad's exactly (docs/from-pytorch.md): pre-LN blocks,
learned position embeddings, exact (erf) GELU, layer-norm eps 1e-5, attention scale
1/sqrt(d_h), GQA/MQA with query head h reading key/value head h // (H_q / H_kv), output logits
tied to the token embedding. Dropout is not part of these modules (xgrad's checkpoints run
in eval mode); add it yourself for training in torch.

Name mapping (xgrad -> torch state_dict), W^T = transposed:
    tok.weight, pos.weight                  -> tok.weight, pos.weight
    <ln>.gamma, <ln>.beta                   -> <ln>.weight, <ln>.bias
    <b>.attn.W_QKV [d, (H_q + 2 H_kv) d_h]  -> <b>.attn.{q,k,v}.weight (row blocks of W_QKV^T)
    <b>.attn.b_QKV                          -> <b>.attn.{q,k,v}.bias
    <b>.attn.W_O, b_O                       -> <b>.attn.o.weight (W_O^T), o.bias
    <b>.cross.W_Q, b_Q                      -> <b>.cross.q.weight (W_Q^T), q.bias
    <b>.cross.W_KV [d, 2 H_kv d_h], b_KV    -> <b>.cross.{k,v}.weight (row blocks of W_KV^T), .bias
    <b>.cross.W_O, b_O                      -> <b>.cross.o.weight (W_O^T), o.bias
    <b>.ffn.fc1.W, fc1.b, fc2.W, fc2.b      -> <b>.ffn.fc1.weight (W^T), .bias, fc2 likewise
with <b> = blocks.i (GPT), encoder.i / decoder.i (encoder-decoder). A GPT trained with
`--no-bias` (metadata bias = false, Config(bias=False); nanoGPT's bias=False) has none of the
biases and betas: its torch modules are built without them (LayerNorm's bias is None).

Hugging Face Llama (LlamaForCausalLM) state dicts <-> xgrad Llama tensors (arch llama):
hf_llama_to_xgrad(state_dict, H_q, H_kv, rope_layout) and xgrad_to_hf_llama(tensors, H_q, H_kv,
rope_layout); names, transposes and the Q/K row permutation of Hugging Face's half-split RoPE
are in their docstrings and docs/llama.md.

Command line (python3 with torch; on Debian 12 /usr/bin/python3 with python3-torch):
    xgrad_torch.py inspect CKPT                          configuration and parameter names
    xgrad_torch.py logits CKPT --tokens "3 1 4" [--tokens ...] [--src "..." --src-length N]
                                                         logits as JSON, computed in torch
    xgrad_torch.py convert CKPT OUT [--dtype float32|float64]
                                                         load in torch and save again
Needs only torch and the Python standard library.
"""

import argparse
import copy
import ctypes
import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["SafetensorsError", "parse_safetensors", "read_safetensors", "save_safetensors", "Config",
           "XgradGPT", "XgradEncoderDecoder", "load_checkpoint", "save_checkpoint", "to_xgrad_tensors",
           "load_xgrad_tensors", "hf_llama_to_xgrad", "xgrad_to_hf_llama"]

# ============================================================================ safetensors


class SafetensorsError(ValueError):
    """A malformed safetensors file, or a checkpoint that does not describe an xgrad model."""


# safetensors dtype tag -> (torch dtype, bytes per element). Every tag of the format that
# torch 1.13 can hold; U16/U32/U64 and the F8 variants are valid tags without a torch 1.13
# dtype, reported as unsupported (not as malformed).
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
TAGS = {dt: tag for tag, (dt, _) in DTYPES.items()}
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
    """bytes -> (dict name -> torch.Tensor, in data order; dict metadata).

    The header is checked before any data is trusted: length within the file, a JSON object
    without duplicate keys, known dtypes, non-negative integer shapes, offsets inside the
    data section and matching the shape, and the data section covered exactly (no overlaps,
    holes or trailing bytes). Every problem raises SafetensorsError naming `where`."""
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
        need = math.prod(shape) * DTYPES[tag][1]
        if end - begin != need:
            fail(what + f"data_offsets span {end - begin} bytes, shape {shape} of {tag} needs {need}")
        entries.append((begin, end, name, tag, shape))

    # Sorted by offset, each tensor starts where the previous one ended, and the last one ends
    # at the end of the file. Empty tensors occupy no bytes.
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
            # bytearray: a private, writable copy (frombuffer shares memory).
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=dt).reshape(shape)
        if tag == "BOOL" and t.numel() and not bool(((t.view(torch.uint8) == 0) | (t.view(torch.uint8) == 1)).all()):
            fail(f"tensor {name!r}: BOOL data holds bytes other than 0 and 1")
        tensors[name] = t
    return tensors, metadata


def read_safetensors(path):
    """A safetensors file -> (dict name -> torch.Tensor, dict metadata)."""
    with open(path, "rb") as f:
        blob = f.read()
    return parse_safetensors(blob, path)


def safetensors_bytes(tensors, metadata=None):
    """dict name -> torch.Tensor (any dtype in DTYPES) -> the bytes of a safetensors file.
    Tensors are laid out in the dict's order; the header is padded with spaces to 8 bytes."""
    if sys.byteorder != "little":
        raise SafetensorsError("writing safetensors needs a little-endian host")
    header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        if name == "__metadata__" or not isinstance(name, str):
            raise SafetensorsError(f"tensor name {name!r} is reserved or not a string")
        if not isinstance(t, torch.Tensor) or t.dtype not in TAGS:
            raise SafetensorsError(f"tensor {name!r}: {getattr(t, 'dtype', type(t))} cannot be stored in safetensors here")
        t = t.detach().to("cpu").contiguous()
        # The raw little-endian bytes (also for float16/bfloat16), without numpy.
        raw = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b""
        header[name] = {"dtype": TAGS[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise SafetensorsError(f"metadata {k!r}: keys and values must be strings")
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def save_safetensors(path, tensors, metadata=None):
    """Writes a safetensors file atomically (temporary file in the same folder, fsync, rename)."""
    blob = safetensors_bytes(tensors, metadata)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


# ============================================================================ configuration


class Config:
    """An xgrad model configuration: the checkpoint metadata keys (train/checkpoint.cpp)."""

    SIZES = ("V_vocab", "context", "d_model", "H_q", "H_kv", "layers", "encoder_layers", "d_ff")

    def __init__(self, kind="gpt", V_vocab=None, context=None, d_model=64, H_q=4, H_kv=0, layers=2,
                 encoder_layers=0, d_ff=0, dtype="float32", vocabulary=None, task="custom", task_params=None,
                 bias=True):
        if kind not in ("gpt", "encoder_decoder"):
            raise ValueError(f"kind must be 'gpt' or 'encoder_decoder', not {kind!r}")
        if vocabulary is None:
            if V_vocab is None:
                raise ValueError("give the vocabulary (a list of token strings) or V_vocab")
            vocabulary = [str(i) for i in range(V_vocab)]
        self.kind, self.task, self.dtype = kind, task, dtype
        self.vocabulary = list(vocabulary)
        self.V_vocab = len(self.vocabulary) if V_vocab is None else V_vocab
        self.context, self.d_model, self.H_q = context, d_model, H_q
        self.H_kv = H_kv or H_q
        self.layers = layers
        self.encoder_layers = (encoder_layers or layers) if kind == "encoder_decoder" else 0
        self.d_ff = d_ff or 4 * d_model
        self.task_params = dict(task_params or {})
        self.bias = bias
        self.validate("Config")

    def validate(self, where):
        def bad(msg):
            raise SafetensorsError(f"{where}: {msg}")
        for k in self.SIZES:
            v = getattr(self, k)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                bad(f"{k} = {v!r} is not a non-negative integer")
        for k in ("V_vocab", "context", "d_model", "H_q", "H_kv", "layers", "d_ff"):
            if getattr(self, k) == 0:
                bad(f"{k} must be positive")
        if self.kind == "encoder_decoder" and self.encoder_layers == 0:
            bad("encoder_layers must be positive")
        if self.d_model % self.H_q or self.H_q % self.H_kv:
            bad(f"heads H_q={self.H_q} H_kv={self.H_kv} do not fit d_model={self.d_model} "
                "(d_model % H_q == 0 and H_q % H_kv == 0 needed)")
        if self.dtype not in ("float32", "float64"):
            bad(f"dtype {self.dtype!r} is not float32 or float64")
        if len(self.vocabulary) != self.V_vocab:
            bad(f"V_vocab {self.V_vocab} but the vocabulary has {len(self.vocabulary)} tokens")
        if not isinstance(self.bias, bool):
            bad(f"bias = {self.bias!r} is not True or False")
        if not self.bias and self.kind != "gpt":
            bad("bias False is for the GPT only (xgrad's encoder-decoder has biases)")

    @property
    def d_h(self):
        return self.d_model // self.H_q

    @property
    def torch_dtype(self):
        return torch.float32 if self.dtype == "float32" else torch.float64

    @classmethod
    def from_metadata(cls, meta, where="<metadata>"):
        def need(k):
            if k not in meta:
                raise SafetensorsError(f"{where}: metadata lacks {k!r}")
            return meta[k]

        def size(k):
            v = need(k)
            if not (v.isascii() and v.isdigit()):
                raise SafetensorsError(f"{where}: metadata {k!r} = {v!r} is not a non-negative integer")
            return int(v)

        kind = need("model")
        if kind not in ("gpt", "encoder_decoder"):
            raise SafetensorsError(f"{where}: unknown model kind {kind!r}")
        if need("layout") != "in_x_out":
            raise SafetensorsError(f"{where}: layout {meta['layout']!r}, expected 'in_x_out'")
        try:
            vocab = json.loads(need("vocabulary"))
        except ValueError as e:
            raise SafetensorsError(f"{where}: metadata 'vocabulary' is not JSON: {e}") from None
        if not isinstance(vocab, list):
            raise SafetensorsError(f"{where}: metadata 'vocabulary' is not a JSON array")
        # Tokens are strings, or arrays of byte values for tokens that are not UTF-8.
        vocab = [t if isinstance(t, str) else bytes(t) for t in vocab]
        c = cls.__new__(cls)
        c.kind, c.task, c.dtype, c.vocabulary = kind, need("task"), need("dtype"), vocab
        for k in cls.SIZES:
            setattr(c, k, size(k))
        c.task_params = {k: meta[k] for k in ("n_digits", "n_values", "min_len", "max_len") if k in meta}
        # xgrad writes 'bias' only as 'false' (a model without biases); absent: biases.
        if meta.get("bias", "false") != "false":
            raise SafetensorsError(f"{where}: metadata 'bias' = {meta['bias']!r}; xgrad writes only 'false' "
                                   "(leave the key out for a model with biases)")
        c.bias = "bias" not in meta
        c.validate(where)
        if size("d_h") != c.d_h or c.d_h * c.H_q != c.d_model:
            raise SafetensorsError(f"{where}: d_h {meta['d_h']} * H_q {c.H_q} != d_model {c.d_model}")
        return c

    def to_metadata(self):
        vocab = [t if isinstance(t, str) else list(t) for t in self.vocabulary]
        m = {k: str(v) for k, v in self.task_params.items()}
        m.update({
            "format": "xgrad-1", "model": self.kind, "task": self.task,
            "vocabulary": json.dumps(vocab, ensure_ascii=False, separators=(",", ":")),
            "layout": "in_x_out", "d_h": str(self.d_h), "dtype": self.dtype,
        })
        for k in self.SIZES:
            m[k] = str(getattr(self, k))
        if not self.bias:
            m["bias"] = "false"
        return m

    def describe(self):
        enc = f" encoder_layers={self.encoder_layers}" if self.kind == "encoder_decoder" else ""
        return (f"{self.kind} V={self.V_vocab} context={self.context} d_model={self.d_model} H_q={self.H_q} "
                f"H_kv={self.H_kv} d_h={self.d_h} layers={self.layers}{enc} d_ff={self.d_ff} {self.dtype}"
                + ("" if self.bias else " bias=False"))


# ============================================================================ the modules


class Attention(nn.Module):
    """Multi-head attention with separate q, k, v, o projections (torch layout). H_kv < H_q is
    GQA (H_kv == 1: MQA): query head h reads key/value head h // (H_q // H_kv)."""

    def __init__(self, d_q, d_kv, H_q, H_kv, d_h, bias=True):
        super().__init__()
        self.H_q, self.H_kv, self.d_h = H_q, H_kv, d_h
        self.q = nn.Linear(d_q, H_q * d_h, bias=bias)
        self.k = nn.Linear(d_kv, H_kv * d_h, bias=bias)
        self.v = nn.Linear(d_kv, H_kv * d_h, bias=bias)
        self.o = nn.Linear(H_q * d_h, d_q, bias=bias)

    def expand_kv(self, t):
        """[B, H_kv, S, d_h] -> [B, H_q, S, d_h]: each kv head serves H_q / H_kv adjacent query heads."""
        r = self.H_q // self.H_kv
        return t.repeat_interleave(r, dim=1) if r > 1 else t

    def forward(self, x, memory=None, allowed=None):
        """x [B, T, d_q]; memory [B, S, d_kv] (None: self-attention on x); allowed: bool,
        broadcastable to [B, H_q, T, S], True = the query may see the key (xgrad's visibility)."""
        kv = x if memory is None else memory
        B, T, _ = x.shape
        S = kv.shape[1]
        # [B, T, H d_h] -> [B, H, T, d_h]: heads split the features.
        q = self.q(x).view(B, T, self.H_q, self.d_h).transpose(1, 2)
        k = self.expand_kv(self.k(kv).view(B, S, self.H_kv, self.d_h).transpose(1, 2))
        v = self.expand_kv(self.v(kv).view(B, S, self.H_kv, self.d_h).transpose(1, 2))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d_h)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        y = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, self.H_q * self.d_h)
        return self.o(y)


def layer_norm(d, bias=True):
    """xgrad's LayerNorm (eps 1e-5); bias False: gamma only (torch 1.13's nn.LayerNorm has no
    bias argument, so its bias parameter is removed: F.layer_norm takes None)."""
    m = nn.LayerNorm(d, eps=1e-5)
    if not bias:
        m.register_parameter("bias", None)
    return m


class FeedForward(nn.Module):
    def __init__(self, d, d_ff, bias=True):
        super().__init__()
        self.fc1 = nn.Linear(d, d_ff, bias=bias)
        self.fc2 = nn.Linear(d_ff, d, bias=bias)
        self.approximate = "none"  # exact erf GELU, as xgrad

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class DecoderBlock(nn.Module):
    """x += attn(ln1(x), causal); x += ffn(ln2(x)). Also the encoder block (with a padding mask)."""

    def __init__(self, c):
        super().__init__()
        self.ln1 = layer_norm(c.d_model, c.bias)
        self.attn = Attention(c.d_model, c.d_model, c.H_q, c.H_kv, c.d_h, c.bias)
        self.ln2 = layer_norm(c.d_model, c.bias)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.bias)

    def forward(self, x, allowed):
        x = x + self.attn(self.ln1(x), allowed=allowed)
        return x + self.ffn(self.ln2(x))


EncoderBlock = DecoderBlock


class CrossDecoderBlock(nn.Module):
    """x += attn(ln1(x), causal); x += cross(ln2(x), memory, source padding); x += ffn(ln3(x))."""

    def __init__(self, c):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.d_model, eps=1e-5)
        self.attn = Attention(c.d_model, c.d_model, c.H_q, c.H_kv, c.d_h)
        self.ln2 = nn.LayerNorm(c.d_model, eps=1e-5)
        self.cross = Attention(c.d_model, c.d_model, c.H_q, c.H_kv, c.d_h)
        self.ln3 = nn.LayerNorm(c.d_model, eps=1e-5)
        self.ffn = FeedForward(c.d_model, c.d_ff)

    def forward(self, x, memory, self_allowed, cross_allowed):
        x = x + self.attn(self.ln1(x), allowed=self_allowed)
        x = x + self.cross(self.ln2(x), memory, allowed=cross_allowed)
        return x + self.ffn(self.ln3(x))


def causal_allowed(T, device=None):
    """[T, T] bool, True where key j <= query i (xgrad's Visibility::causal(T, T))."""
    i = torch.arange(T, device=device)
    return i.view(1, T) <= i.view(T, 1)


def key_length_allowed(src_lengths, S, device=None):
    """[B, 1, 1, S] bool, True for the first src_lengths[b] keys (Visibility::key_lengths)."""
    lens = torch.as_tensor(src_lengths, dtype=torch.int64, device=device).view(-1, 1, 1, 1)
    if bool((lens < 1).any()) or bool((lens > S).any()):
        raise ValueError(f"src_lengths {lens.view(-1).tolist()} must be in 1..{S}")
    return torch.arange(S, device=device).view(1, 1, 1, S) < lens


class _XgradModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        c.validate(type(self).__name__)
        self.config = c
        self.tok = nn.Embedding(c.V_vocab, c.d_model)
        self.pos = nn.Embedding(c.context, c.d_model)

    def embed(self, tokens, start=0):
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [B, T], have shape {list(tokens.shape)}")
        T = tokens.shape[1]
        if T == 0 or start + T > self.config.context:
            raise ValueError(f"positions {start}..{start + T - 1} must be within the context length "
                             f"{self.config.context} (and T >= 1)")
        return self.tok(tokens) + self.pos(torch.arange(start, start + T, device=tokens.device))

    def head(self, h):
        return F.linear(self.ln_f(h), self.tok.weight)  # tied output embedding, no bias


class XgradGPT(_XgradModel):
    """xgrad's decoder-only GPT (nn/transformer.hpp) in torch."""

    def __init__(self, c):
        if c.kind != "gpt":
            raise ValueError(f"XgradGPT needs a 'gpt' configuration, not {c.kind!r}")
        super().__init__(c)
        self.blocks = nn.ModuleList(DecoderBlock(c) for _ in range(c.layers))
        self.ln_f = layer_norm(c.d_model, c.bias)

    def forward(self, tokens):
        """tokens [B, T] int64 -> logits [B, T, V_vocab]."""
        h = self.embed(tokens)
        allowed = causal_allowed(tokens.shape[1], tokens.device)
        for b in self.blocks:
            h = b(h, allowed)
        return self.head(h)


class XgradEncoderDecoder(_XgradModel):
    """xgrad's encoder-decoder with cross attention (nn/transformer.hpp) in torch."""

    def __init__(self, c):
        if c.kind != "encoder_decoder":
            raise ValueError(f"XgradEncoderDecoder needs an 'encoder_decoder' configuration, not {c.kind!r}")
        super().__init__(c)
        self.encoder = nn.ModuleList(EncoderBlock(c) for _ in range(c.encoder_layers))
        self.ln_enc = nn.LayerNorm(c.d_model, eps=1e-5)
        self.decoder = nn.ModuleList(CrossDecoderBlock(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d_model, eps=1e-5)

    def encode(self, src, src_lengths):
        """src [B, S] (padded after src_lengths[b] real tokens) -> memory [B, S, d_model].
        Bidirectional; padded keys are hidden from every query."""
        h = self.embed(src)
        allowed = key_length_allowed(src_lengths, src.shape[1], src.device)
        for b in self.encoder:
            h = b(h, allowed)
        return self.ln_enc(h)

    def decode(self, tgt, memory, src_lengths):
        """tgt [B, T] -> logits [B, T, V_vocab]: causal over the target, cross attention to the
        real source positions."""
        h = self.embed(tgt)
        self_allowed = causal_allowed(tgt.shape[1], tgt.device)
        cross_allowed = key_length_allowed(src_lengths, memory.shape[1], tgt.device)
        for b in self.decoder:
            h = b(h, memory, self_allowed, cross_allowed)
        return self.head(h)

    def forward(self, src, src_lengths, tgt):
        return self.decode(tgt, self.encode(src, src_lengths), src_lengths)


def build_model(config):
    """An untrained XgradGPT / XgradEncoderDecoder for the configuration, in its dtype."""
    cls = XgradGPT if config.kind == "gpt" else XgradEncoderDecoder
    return cls(config).to(config.torch_dtype)


# ============================================================================ name mapping


def _blocks(model):
    """(xgrad prefix, torch block, has cross attention) for every block."""
    if isinstance(model, XgradGPT):
        return [(f"blocks.{i}.", b, False) for i, b in enumerate(model.blocks)]
    return ([(f"encoder.{i}.", b, False) for i, b in enumerate(model.encoder)] +
            [(f"decoder.{i}.", b, True) for i, b in enumerate(model.decoder)])


def _block_norms(cross):
    return ["ln1", "ln2", "ln3"] if cross else ["ln1", "ln2"]


def _model_norms(model):
    return ["ln_enc", "ln_f"] if isinstance(model, XgradEncoderDecoder) else ["ln_f"]


def to_xgrad_tensors(model, dtype=None):
    """The model's parameters as xgrad checkpoint tensors (in x out), in xgrad's order: new
    tensors (copies, not views of the parameters), in `dtype` if given."""
    def t(x):
        x = x.detach()
        return (x if dtype is None else x.to(dtype)).clone(memory_format=torch.contiguous_format)

    out = {"tok.weight": t(model.tok.weight), "pos.weight": t(model.pos.weight)}

    # A model without biases (Config.bias False) has no bias or beta tensors.
    def ln(prefix, m):
        out[prefix + ".gamma"] = t(m.weight)
        if m.bias is not None:
            out[prefix + ".beta"] = t(m.bias)

    def ffn(prefix, m):
        for fc in ("fc1", "fc2"):
            lin = getattr(m, fc)
            out[f"{prefix}ffn.{fc}.W"] = t(lin.weight.t())
            if lin.bias is not None:
                out[f"{prefix}ffn.{fc}.b"] = t(lin.bias)

    def self_attn(prefix, a):
        out[prefix + "W_QKV"] = t(torch.cat([a.q.weight, a.k.weight, a.v.weight], 0).t())
        if a.q.bias is not None:
            out[prefix + "b_QKV"] = t(torch.cat([a.q.bias, a.k.bias, a.v.bias], 0))
        out[prefix + "W_O"] = t(a.o.weight.t())
        if a.o.bias is not None:
            out[prefix + "b_O"] = t(a.o.bias)

    def cross_attn(prefix, a):
        out[prefix + "W_Q"], out[prefix + "b_Q"] = t(a.q.weight.t()), t(a.q.bias)
        out[prefix + "W_KV"] = t(torch.cat([a.k.weight, a.v.weight], 0).t())
        out[prefix + "b_KV"] = t(torch.cat([a.k.bias, a.v.bias], 0))
        out[prefix + "W_O"], out[prefix + "b_O"] = t(a.o.weight.t()), t(a.o.bias)

    def block(prefix, b, cross):
        ln(prefix + "ln1", b.ln1)
        self_attn(prefix + "attn.", b.attn)
        ln(prefix + "ln2", b.ln2)
        if cross:
            cross_attn(prefix + "cross.", b.cross)
            ln(prefix + "ln3", b.ln3)
        ffn(prefix, b.ffn)

    # xgrad's registration order: tok, pos, blocks (GPT) / encoder, ln_enc, decoder (enc-dec), ln_f.
    blocks = _blocks(model)
    for prefix, b, cross in blocks:
        if prefix.startswith("decoder.0."):
            ln("ln_enc", model.ln_enc)
        block(prefix, b, cross)
    ln("ln_f", model.ln_f)
    return out


def load_xgrad_tensors(model, tensors, where="<tensors>"):
    """Copies xgrad checkpoint tensors (in x out) into the model: every parameter must be
    present with the shape the configuration implies, and every tensor must be used."""
    expected = to_xgrad_tensors(model)
    missing = [k for k in expected if k not in tensors]
    extra = [k for k in tensors if k not in expected]
    if missing or extra:
        raise SafetensorsError(f"{where}: tensors do not match the model: missing {missing}, not parameters {extra}")
    for k, e in expected.items():
        if list(tensors[k].shape) != list(e.shape):
            raise SafetensorsError(f"{where}: {k!r} has shape {list(tensors[k].shape)}, the model expects {list(e.shape)}")
        if not tensors[k].is_floating_point():
            raise SafetensorsError(f"{where}: {k!r} is {tensors[k].dtype}, not a floating-point tensor")
    c = model.config
    qd, kd = c.H_q * c.d_h, c.H_kv * c.d_h
    sd = {"tok.weight": tensors["tok.weight"], "pos.weight": tensors["pos.weight"]}

    def ln(x, tprefix):
        sd[tprefix + ".weight"] = tensors[x + ".gamma"]
        if c.bias:
            sd[tprefix + ".bias"] = tensors[x + ".beta"]

    for prefix, _, cross in _blocks(model):
        for name in _block_norms(cross):
            ln(prefix + name, prefix + name)
        W = tensors[prefix + "attn.W_QKV"].t()
        # W_QKV's columns (W^T's rows) are [Q heads | K heads | V heads], head-major in each.
        for part, w in zip("qkv", W.split([qd, kd, kd], 0)):
            sd[f"{prefix}attn.{part}.weight"] = w
        sd[prefix + "attn.o.weight"] = tensors[prefix + "attn.W_O"].t()
        if c.bias:
            for part, bb in zip("qkv", tensors[prefix + "attn.b_QKV"].split([qd, kd, kd], 0)):
                sd[f"{prefix}attn.{part}.bias"] = bb
            sd[prefix + "attn.o.bias"] = tensors[prefix + "attn.b_O"]
        if cross:
            sd[prefix + "cross.q.weight"], sd[prefix + "cross.q.bias"] = tensors[prefix + "cross.W_Q"].t(), tensors[prefix + "cross.b_Q"]
            W, b = tensors[prefix + "cross.W_KV"].t(), tensors[prefix + "cross.b_KV"]
            for part, w, bb in zip("kv", W.split([kd, kd], 0), b.split([kd, kd], 0)):
                sd[f"{prefix}cross.{part}.weight"], sd[f"{prefix}cross.{part}.bias"] = w, bb
            sd[prefix + "cross.o.weight"], sd[prefix + "cross.o.bias"] = tensors[prefix + "cross.W_O"].t(), tensors[prefix + "cross.b_O"]
        for fc in ("fc1", "fc2"):
            sd[f"{prefix}ffn.{fc}.weight"] = tensors[f"{prefix}ffn.{fc}.W"].t()
            if c.bias:
                sd[f"{prefix}ffn.{fc}.bias"] = tensors[f"{prefix}ffn.{fc}.b"]
    for name in _model_norms(model):
        ln(name, name)
    dt = next(model.parameters()).dtype
    model.load_state_dict({k: v.to(dt).contiguous() for k, v in sd.items()}, strict=True)
    return model


# ============================================================================ checkpoints


def load_checkpoint(path, dtype=None):
    """An xgrad checkpoint -> XgradGPT or XgradEncoderDecoder in eval mode, in the checkpoint's
    dtype (or `dtype`, e.g. torch.float64). Its .config holds the configuration and the
    vocabulary, .metadata the checkpoint's metadata."""
    tensors, meta = read_safetensors(path)
    c = Config.from_metadata(meta, path)
    want = c.torch_dtype
    for k, t in tensors.items():
        if t.dtype != want:
            raise SafetensorsError(f"{path}: {k!r} is {t.dtype}, the metadata says {c.dtype}")
    model = build_model(c)
    load_xgrad_tensors(model, tensors, path)
    model.metadata = dict(meta)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def save_checkpoint(model, path, metadata=None):
    """Saves an XgradGPT / XgradEncoderDecoder as an xgrad checkpoint that `xgrad generate`,
    `xgrad inspect` and train::load_model read. Parameters are stored in the model's dtype
    (float32 or float64; float16/bfloat16 models are widened to float32); every value must be
    finite. `metadata` adds string entries (the model's configuration always wins)."""
    if not isinstance(model, _XgradModel):
        raise TypeError(f"save_checkpoint needs an XgradGPT or XgradEncoderDecoder, not {type(model).__name__}")
    dt = next(model.parameters()).dtype
    store = dt if dt in (torch.float32, torch.float64) else torch.float32
    tensors = to_xgrad_tensors(model, store)
    for k, t in tensors.items():
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"save_checkpoint: parameter {k!r} holds non-finite values; xgrad refuses to load them")
    c = copy.copy(model.config)
    c.dtype = "float32" if store == torch.float32 else "float64"
    meta = {k: v for k, v in getattr(model, "metadata", {}).items() if k != "xgrad_version"}
    meta.update(metadata or {})
    meta.update(c.to_metadata())
    meta["written_by"] = f"tools/xgrad_torch.py (torch {torch.__version__})"
    save_safetensors(path, tensors, meta)


# ============================================================================ command line



# ============================================================================ Hugging Face Llama names

def _hf_permute(w, n_heads):
    """Meta's interleaved Q/K rows -> Hugging Face's half-split order (convert_llama_weights_to_hf's
    permute): within each head, rows 0, 2, 4, ... (the first feature of each rotary pair) come
    first, then rows 1, 3, 5, ...  w is [n_heads * d_h, d] (out x in)."""
    rows, cols = w.shape
    d_h = rows // n_heads
    return w.reshape(n_heads, d_h // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _hf_unpermute(w, n_heads):
    """The inverse of _hf_permute: Hugging Face's half-split Q/K rows -> Meta's interleaved."""
    rows, cols = w.shape
    d_h = rows // n_heads
    return w.reshape(n_heads, 2, d_h // 2, cols).transpose(1, 2).reshape(rows, cols)


def _hf_layers(names):
    layers = set()
    for n in names:
        if n.startswith("model.layers."):
            part = n[len("model.layers."):].split(".", 1)[0]
            if not part.isdigit():
                raise ValueError(f"hf_llama_to_xgrad: {n!r} is not a Llama parameter name")
            layers.add(int(part))
    if layers != set(range(len(layers))):
        raise ValueError(f"hf_llama_to_xgrad: layers {sorted(layers)} are not 0 .. {len(layers) - 1}")
    return len(layers)


def _rope_layout(layout, fn):
    """"interleaved", or "half_split" (also spelled "half-split", as xgrad's metadata writes it)."""
    if layout == "half-split":
        layout = "half_split"
    if layout not in ("interleaved", "half_split"):
        raise ValueError(f"{fn}: rope_layout {layout!r} is not interleaved or half_split")
    return layout


HF_LLAMA_LAYER = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                  "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                  "input_layernorm.weight", "post_attention_layernorm.weight")


def hf_llama_to_xgrad(state_dict, H_q, H_kv, rope_layout="interleaved"):
    """A Hugging Face LlamaForCausalLM state dict -> (xgrad tensors, tied), docs/llama.md.

    Names: model.embed_tokens.weight -> tok.weight; model.layers.L.input_layernorm.weight ->
    blocks.L.attn_norm.weight; self_attn.{q,k,v}_proj.weight -> blocks.L.attn.W_QKV (transposed
    to in x out and packed as columns [Q | K | V]); self_attn.o_proj.weight -> blocks.L.attn.W_O
    (transposed); post_attention_layernorm.weight -> blocks.L.ffn_norm.weight; mlp.gate_proj,
    up_proj, down_proj -> blocks.L.ffn.gate.W, ffn.up.W, ffn.down.W (transposed);
    model.norm.weight -> norm.weight; lm_head.weight -> classifier.weight, or nothing when the
    classifier is tied (tied = True: lm_head.weight absent, or the same tensor storage as the
    embedding, as HF's tie_word_embeddings makes it).

    RoPE: Hugging Face rotates (i, i + d_h/2) (rotate_half) and its conversion script permuted
    Meta's Q and K rows so that the same model gives the same output. rope_layout
    "interleaved" (the default) un-permutes Q and K back to Meta's order, for an xgrad model with
    rope_layout interleaved (llama2.c's, xgrad's default; needed for xgrad export llama2c);
    "half_split" (or "half-split", the metadata's spelling) keeps Hugging Face's rows, for an
    xgrad model with rope_layout half-split. Both
    give the same logits. HF's Llama rotates the whole head: the xgrad model needs rope_fraction 1.
    H_q and H_kv (num_attention_heads, num_key_value_heads) are needed to find the heads."""
    rope_layout = _rope_layout(rope_layout, "hf_llama_to_xgrad")
    if H_q < 1 or H_kv < 1 or H_q % H_kv:
        raise ValueError(f"hf_llama_to_xgrad: H_q {H_q} must be a positive multiple of H_kv {H_kv}")
    sd = dict(state_dict)
    L = _hf_layers(sd)
    expected = {"model.embed_tokens.weight", "model.norm.weight"}
    expected |= {f"model.layers.{i}.{n}" for i in range(L) for n in HF_LLAMA_LAYER}
    optional = {"lm_head.weight"} | {f"model.layers.{i}.self_attn.rotary_emb.inv_freq" for i in range(L)}
    missing = sorted(expected - set(sd))
    extra = sorted(set(sd) - expected - optional)
    if missing or extra:
        raise ValueError(f"hf_llama_to_xgrad: missing {missing}, not Llama parameters {extra}")
    emb = sd["model.embed_tokens.weight"]
    head = sd.get("lm_head.weight")
    tied = head is None or (head.data_ptr() == emb.data_ptr() and head.shape == emb.shape)

    def t(x):
        return x.detach().clone(memory_format=torch.contiguous_format)

    out = {"tok.weight": t(emb)}
    for i in range(L):
        p, b = f"model.layers.{i}.", f"blocks.{i}."
        q, k, v = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"], sd[p + "self_attn.v_proj.weight"]
        if q.shape[0] % H_q or k.shape[0] % H_kv or (q.shape[0] // H_q) % 2:
            raise ValueError(f"hf_llama_to_xgrad: {p}self_attn q_proj {list(q.shape)} / k_proj {list(k.shape)} do "
                             f"not split into {H_q} / {H_kv} heads of an even size")
        if rope_layout == "interleaved":
            q, k = _hf_unpermute(q, H_q), _hf_unpermute(k, H_kv)
        out[b + "attn_norm.weight"] = t(sd[p + "input_layernorm.weight"])
        out[b + "attn.W_QKV"] = t(torch.cat([q, k, v], 0).t())
        out[b + "attn.W_O"] = t(sd[p + "self_attn.o_proj.weight"].t())
        out[b + "ffn_norm.weight"] = t(sd[p + "post_attention_layernorm.weight"])
        out[b + "ffn.gate.W"] = t(sd[p + "mlp.gate_proj.weight"].t())
        out[b + "ffn.up.W"] = t(sd[p + "mlp.up_proj.weight"].t())
        out[b + "ffn.down.W"] = t(sd[p + "mlp.down_proj.weight"].t())
    out["norm.weight"] = t(sd["model.norm.weight"])
    if not tied:
        out["classifier.weight"] = t(head)
    return out, tied


def xgrad_to_hf_llama(tensors, H_q, H_kv, rope_layout="interleaved", lm_head_when_tied=False):
    """xgrad Llama tensors (as a checkpoint holds them) -> a Hugging Face LlamaForCausalLM state
    dict: the inverse of hf_llama_to_xgrad. rope_layout is the xgrad model's (its metadata's
    rope_layout): "interleaved" permutes Q and K rows into Hugging Face's half-split order,
    "half_split" leaves them. A tied model (no classifier.weight) has no lm_head.weight, unless
    lm_head_when_tied (then a copy of the embedding, for loaders that want the key)."""
    rope_layout = _rope_layout(rope_layout, "xgrad_to_hf_llama")
    L = 0
    while f"blocks.{L}.attn.W_QKV" in tensors:
        L += 1
    expected = {"tok.weight", "norm.weight"} | {
        f"blocks.{i}.{n}" for i in range(L) for n in ("attn_norm.weight", "attn.W_QKV", "attn.W_O", "ffn_norm.weight",
                                                       "ffn.gate.W", "ffn.up.W", "ffn.down.W")}
    missing = sorted(expected - set(tensors))
    extra = sorted(set(tensors) - expected - {"classifier.weight"})
    if missing or extra or L == 0:
        raise ValueError(f"xgrad_to_hf_llama: not an xgrad Llama model: missing {missing}, not Llama tensors {extra}")

    def t(x):
        return x.detach().clone(memory_format=torch.contiguous_format)

    out = {"model.embed_tokens.weight": t(tensors["tok.weight"])}
    for i in range(L):
        b, p = f"blocks.{i}.", f"model.layers.{i}."
        W = tensors[b + "attn.W_QKV"].t()
        d_h = W.shape[0] // (H_q + 2 * H_kv)
        if d_h * (H_q + 2 * H_kv) != W.shape[0] or d_h % 2:
            raise ValueError(f"xgrad_to_hf_llama: {b}attn.W_QKV {list(W.shape[::-1])} does not split into "
                             f"{H_q} + 2 x {H_kv} heads of an even size")
        q, k, v = W[:H_q * d_h], W[H_q * d_h:(H_q + H_kv) * d_h], W[(H_q + H_kv) * d_h:]
        if rope_layout == "interleaved":
            q, k = _hf_permute(q, H_q), _hf_permute(k, H_kv)
        out[p + "self_attn.q_proj.weight"] = t(q)
        out[p + "self_attn.k_proj.weight"] = t(k)
        out[p + "self_attn.v_proj.weight"] = t(v)
        out[p + "self_attn.o_proj.weight"] = t(tensors[b + "attn.W_O"].t())
        out[p + "mlp.gate_proj.weight"] = t(tensors[b + "ffn.gate.W"].t())
        out[p + "mlp.up_proj.weight"] = t(tensors[b + "ffn.up.W"].t())
        out[p + "mlp.down_proj.weight"] = t(tensors[b + "ffn.down.W"].t())
        out[p + "input_layernorm.weight"] = t(tensors[b + "attn_norm.weight"])
        out[p + "post_attention_layernorm.weight"] = t(tensors[b + "ffn_norm.weight"])
    out["model.norm.weight"] = t(tensors["norm.weight"])
    if "classifier.weight" in tensors:
        out["lm_head.weight"] = t(tensors["classifier.weight"])
    elif lm_head_when_tied:
        out["lm_head.weight"] = t(tensors["tok.weight"])
    return out


def _ids(text, V, what):
    try:
        ids = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise SystemExit(f"xgrad_torch: {what} {text!r}: not a list of integers") from None
    if not ids or any(i < 0 or i >= V for i in ids):
        raise SystemExit(f"xgrad_torch: {what} {text!r}: need token ids in 0..{V - 1}")
    return ids


def main(argv=None):
    ap = argparse.ArgumentParser(prog="xgrad_torch.py", description="xgrad checkpoints in PyTorch")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("inspect", help="configuration and parameters of a checkpoint")
    p.add_argument("checkpoint")
    p = sub.add_parser("logits", help="logits computed in torch, as JSON")
    p.add_argument("checkpoint")
    p.add_argument("--tokens", action="append", required=True,
                   help="token ids of one sequence (GPT) or target (encoder-decoder); repeat for a batch")
    p.add_argument("--src", action="append", help="encoder-decoder: source ids of each sequence (padded)")
    p.add_argument("--src-length", action="append", type=int, help="encoder-decoder: real source tokens")
    p.add_argument("--float64", action="store_true", help="compute in float64")
    p = sub.add_parser("convert", help="load in torch and save again as an xgrad checkpoint")
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--dtype", choices=["float32", "float64"])
    a = ap.parse_args(argv)
    try:
        model = load_checkpoint(a.checkpoint)
    except (OSError, SafetensorsError) as e:
        raise SystemExit(f"xgrad_torch: {e}") from None
    c = model.config
    if a.cmd == "inspect":
        print(c.describe())
        for k, t in to_xgrad_tensors(model).items():
            print(f"  {k:32s} {list(t.shape)}")
        print(f"{sum(t.numel() for t in model.parameters())} parameters")
        return 0
    if a.cmd == "convert":
        if a.dtype:
            model = model.to(torch.float32 if a.dtype == "float32" else torch.float64)
        save_checkpoint(model, a.out)
        print(f"{a.checkpoint} -> {a.out} ({Config.from_metadata(read_safetensors(a.out)[1], a.out).describe()})")
        return 0
    if a.float64:
        model = model.double()
    rows = [_ids(t, c.V_vocab, "--tokens") for t in a.tokens]
    if len({len(r) for r in rows}) != 1:
        raise SystemExit("xgrad_torch: every --tokens needs the same length")
    tokens = torch.tensor(rows, dtype=torch.int64)
    with torch.no_grad():
        if c.kind == "gpt":
            if a.src:
                raise SystemExit("xgrad_torch: --src is for encoder-decoder checkpoints")
            logits = model(tokens)
        else:
            if not a.src or len(a.src) != len(rows):
                raise SystemExit("xgrad_torch: an encoder-decoder needs one --src per --tokens")
            src = [_ids(s, c.V_vocab, "--src") for s in a.src]
            if len({len(s) for s in src}) != 1:
                raise SystemExit("xgrad_torch: every --src needs the same length")
            lengths = a.src_length or [len(s) for s in src]
            if len(lengths) != len(src):
                raise SystemExit("xgrad_torch: give --src-length for every --src, or none")
            try:
                logits = model(torch.tensor(src, dtype=torch.int64), lengths, tokens)
            except ValueError as e:
                raise SystemExit(f"xgrad_torch: {e}") from None
    json.dump({"shape": list(logits.shape), "data": logits.double().reshape(-1).tolist()}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
