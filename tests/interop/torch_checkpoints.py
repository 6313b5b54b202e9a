#!/usr/bin/python3
"""Checkpoint interop with PyTorch through tools/xgrad_torch.py (run by run_interop.sh).

Usage:
  torch_checkpoints.py compare --out DIR [--also-read FILE]... CHECKPOINT LOGITS_JSON [...]
  torch_checkpoints.py roundtrip DIR
  torch_checkpoints.py half OUT.safetensors

compare:
1. A self-test of the tool's safetensors reader and writer: valid files of every kind it
   must accept (no tensors, only metadata, every dtype, scalars, zero-size tensors, header
   order != data order, padded and unpadded headers), malformed files it must reject
   (including corrupted copies of a real xgrad checkpoint), and files its writer wrote.
2. Each xgrad checkpoint (GPT or encoder-decoder) is loaded with
   xgrad_torch.load_checkpoint, and its logits for the token batches in LOGITS_JSON
   (written by dump_logits from the same file) are compared with xgrad's to TOL max abs,
   with the torch model run in float64 (the exact reference for the stored weights) and in
   float32. For float64 checkpoints the float64 torch model must agree to TOL_F64.
3. Negative controls: the loaded model with a known mistake (W_O not transposed; GQA grouping
   by tile instead of repeat_interleave; for float64 checkpoints also tanh-approximated GELU
   and layer-norm eps 1e-6) must move the logits by CONTROL_FACTOR x the tolerance, so a
   pass above means those details really were checked.
4. The way back: every checkpoint is saved again with xgrad_torch.save_checkpoint as it was
   loaded (DIR/caseN-rt) and after one Adam step in torch (DIR/caseN-tuned); a GPT and an
   encoder-decoder built in torch from scratch are saved too (DIR/scratch-KIND-tuned).
   DIR/roundtrip.txt lists them; run_interop.sh has dump_logits compute xgrad's logits of
   every DIR/X/model.safetensors into DIR/X.xgrad.json.
roundtrip: xgrad's logits of each re-saved checkpoint must equal xgrad's logits of the
   original exactly (the transposes are exact), and xgrad's logits of each tuned or
   built-in-torch checkpoint must agree with torch's (the tool's model of the same file) to
   the same tolerances as in 2.
half: writes float16 and bfloat16 tensors (every one of the 65536 bit patterns of each, so
   subnormals, +-inf, NaNs and -0.0 included) with the tool's safetensors writer, each next
   to torch's float32 conversion (NAME.expected), for half_check.

Prints one line per check that is worth seeing and ends with "N passed, M failed";
exit 0 if all passed, 1 otherwise, 77 ("SKIPPED: ...") if torch cannot be imported.
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the machine
    print(f"SKIPPED: torch is not importable by {sys.executable} ({exc}); "
          "install python3-torch or set XGRAD_TORCH_PYTHON")
    sys.exit(77)

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "xgrad_torch.py")
sys.path.insert(0, os.path.dirname(TOOL))
import xgrad_torch as xt  # noqa: E402  (the tool under test)
from xgrad_torch import SafetensorsError, parse_safetensors  # noqa: E402

TOL = 5e-6  # max abs over all logits, for every float32 checkpoint
# float64 checkpoints (dump_logits --float64-copy): xgrad and torch both compute in float64
# from identical weights, so they must also agree to rounding level (~1e-15 observed).
TOL_F64 = 1e-10
CONTROL_FACTOR = 100  # a deliberate mistake must move some logit by 100x the tolerance


def json_tensor(a, dtype):
    t = torch.tensor(a["data"], dtype=dtype)
    if t.numel() != math.prod(a["shape"]):
        raise ValueError(f"JSON array: shape {a['shape']} but {t.numel()} values")
    return t.reshape(a["shape"])


def run_case(model, case, grad=False):
    """The model's logits for one dump case (GPT or encoder-decoder), in the model's dtype."""
    tokens = json_tensor(case["tokens"], torch.int64)
    with torch.set_grad_enabled(grad):
        if "src" in case:
            return model(json_tensor(case["src"], torch.int64), case["src_lengths"], tokens)
        return model(tokens)


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




def writer_self_test(tally, tmpdir):
    """save_safetensors -> parse_safetensors gives back every dtype exactly; the file is the
    bytes safetensors_bytes makes; metadata survives; bad input raises."""
    tensors = {
        "f32": torch.tensor([[1.5, -0.0], [float("inf"), 3.0]], dtype=torch.float32),
        "f64": torch.tensor([math.pi, -1e-300], dtype=torch.float64),
        "f16": torch.tensor([1.0, 6e-8, -65504.0], dtype=torch.float16),
        "bf16": torch.tensor([1.5, -3.0e38], dtype=torch.bfloat16),
        "i64": torch.tensor([-(2 ** 63), 2 ** 63 - 1], dtype=torch.int64),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "scalar": torch.tensor(2.0, dtype=torch.float64),
        "empty": torch.empty(0, 3, dtype=torch.float32),
        "strided": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),  # not contiguous
    }
    path = os.path.join(tmpdir, "writer.safetensors")
    xt.save_safetensors(path, tensors, {"k": "v", "naïve": "∑"})
    got, meta = xt.read_safetensors(path)
    same = list(got) == list(tensors) and meta == {"k": "v", "naïve": "∑"} and all(
        got[k].dtype == t.dtype and got[k].shape == t.shape and torch.equal(got[k], t) for k, t in tensors.items())
    tally.check(same, f"writer: {len(tensors)} tensors of every kind read back exactly, metadata too")
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    tally.check((8 + n) % 8 == 0 and not os.path.exists(f"{path}.tmp.{os.getpid()}"),
                "writer: data section 8-byte aligned, no temporary file left", quiet_ok=True)
    for label, bad in (("a complex tensor", {"c": torch.zeros(2, dtype=torch.complex64)}),
                       ("the name __metadata__", {"__metadata__": torch.zeros(1)})):
        try:
            xt.safetensors_bytes(bad)
            tally.check(False, f"writer accepted {label}")
        except SafetensorsError as e:
            tally.check(True, f"writer refuses {label}: {e}", quiet_ok=True)


def compare_checkpoint(tally, ckpt, logits_json, worst):
    label = os.path.basename(os.path.dirname(os.path.abspath(ckpt))) or ckpt
    with open(logits_json) as f:
        dump = json.load(f)
    m64 = xt.load_checkpoint(ckpt, dtype=torch.float64)
    m32 = xt.load_checkpoint(ckpt, dtype=torch.float32)
    c = m64.config
    print(f"{label}: {ckpt}\n  {c.describe()}")
    if (dump["model"], dump["V_vocab"], dump["context"], dump["dtype"]) != (c.kind, c.V_vocab, c.context, c.dtype):
        tally.check(False, f"{label}: {logits_json} does not describe {ckpt}")
        return
    tol64 = TOL_F64 if c.dtype == "float64" else TOL
    for i, case in enumerate(dump["cases"]):
        ref = json_tensor(case["logits"], torch.float64)
        B, T = case["tokens"]["shape"]
        if list(ref.shape) != [B, T, c.V_vocab]:
            tally.check(False, f"{label} case {i}: logits shape {list(ref.shape)} != {[B, T, c.V_vocab]}")
            continue
        e64 = (run_case(m64, case) - ref).abs().max().item()
        e32 = (run_case(m32, case).double() - ref).abs().max().item()
        for k, e in (("torch64", e64), ("torch32", e32)):
            worst[(c.kind, c.dtype, k)] = max(worst.get((c.kind, c.dtype, k), 0.0), e)
        src = f", S={case['src']['shape'][1]}, src_lengths={case['src_lengths']}" if "src" in case else ""
        tally.check(e64 <= tol64 and e32 <= TOL,
                    f"{label} case {i} [B={B}, T={T}{src}]: max|xgrad - torch64| = {e64:.2e} (tol {tol64:g}), "
                    f"max|xgrad - torch32| = {e32:.2e} (tol {TOL:g}; max|logit| = {ref.abs().max().item():.3g})")

    # The tool's command line on the longest case (float64: the exact reference).
    case = max(dump["cases"], key=lambda k: k["tokens"]["shape"][1])
    args = [sys.executable, TOOL, "logits", ckpt, "--float64"]
    for row in json_tensor(case["tokens"], torch.int64).tolist():
        args += ["--tokens", " ".join(map(str, row))]
    if "src" in case:
        for row, n in zip(json_tensor(case["src"], torch.int64).tolist(), case["src_lengths"]):
            args += ["--src", " ".join(map(str, row)), "--src-length", str(n)]
    run = subprocess.run(args, capture_output=True, text=True)
    try:
        e = (json_tensor(json.loads(run.stdout), torch.float64) - json_tensor(case["logits"], torch.float64)).abs().max().item()
    except (ValueError, KeyError, RuntimeError):
        e = math.inf
    tally.check(run.returncode == 0 and e <= tol64, f"{label}: `xgrad_torch.py logits` prints the same logits "
                f"(max|diff| = {e:.2e}){'' if run.returncode == 0 else ': ' + run.stderr.strip()}")

    # Negative controls on the longest case, each on a fresh float64 model.
    case = max(dump["cases"], key=lambda k: k["tokens"]["shape"][1])
    ref = json_tensor(case["logits"], torch.float64)

    def attentions(m):
        return [mod for mod in m.modules() if isinstance(mod, xt.Attention)]

    def untransposed_W_O(m):
        for a in attentions(m):
            with torch.no_grad():  # the xgrad W_O [H_q d_h, d] read as if it were torch's [d, H_q d_h]
                a.o.weight.copy_(a.o.weight.t().contiguous().reshape(a.o.weight.shape))

    def tile_gqa(m):
        for a in attentions(m):
            r = a.H_q // a.H_kv
            a.expand_kv = (lambda t, r=r: t.repeat(1, r, 1, 1))

    def tanh_gelu(m):
        for f in m.modules():
            if isinstance(f, xt.FeedForward):
                f.approximate = "tanh"

    def ln_eps(m):
        for ln in m.modules():
            if isinstance(ln, torch.nn.LayerNorm):
                ln.eps = 1e-6

    controls = [("W_O not transposed", untransposed_W_O)]
    if 1 < c.H_kv < c.H_q:  # with H_kv == 1 or H_kv == H_q tile and interleave coincide
        controls.append(("GQA grouping by tile instead of repeat_interleave", tile_gqa))
    if c.dtype == "float64":  # too subtle for float32 rounding to show reliably
        controls += [("tanh GELU instead of erf", tanh_gelu), ("layer-norm eps 1e-6", ln_eps)]
    need = CONTROL_FACTOR * tol64
    for what, spoil in controls:
        m = xt.load_checkpoint(ckpt, dtype=torch.float64)
        spoil(m)
        d = (run_case(m, case) - ref).abs().max().item()
        tally.check(d >= need, f"{label} control, {what}: max|diff| = {d:.2e} "
                    f"(must be >= {need:g}, else the comparison could not see the mistake)")


def write_round_trips(tally, ckpt, logits_json, out, name):
    """caseN-rt: loaded and saved unchanged; caseN-tuned: after one Adam step in torch, with
    torch's logits of the saved file for the dump's cases."""
    with open(logits_json) as f:
        dump = json.load(f)
    model = xt.load_checkpoint(ckpt)
    rt = os.path.join(out, f"{name}-rt", "model.safetensors")
    os.makedirs(os.path.dirname(rt), exist_ok=True)
    xt.save_checkpoint(model, rt)

    # One training step in torch on the longest case (next-token loss for a GPT, the target
    # shifted by one for the encoder-decoder): every parameter moves.
    case = max(dump["cases"], key=lambda k: k["tokens"]["shape"][1])
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    logits = run_case(model, case, grad=True)
    tokens = json_tensor(case["tokens"], torch.int64)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    before = xt.to_xgrad_tensors(model)
    opt.step()
    model.eval()
    after = xt.to_xgrad_tensors(model)
    moved = min((after[k].double() - before[k].double()).abs().max().item() for k in before)
    tally.check(moved > 1e-4, f"{name}: one Adam step in torch moved every parameter (smallest max change {moved:.2e})")
    tuned = os.path.join(out, f"{name}-tuned", "model.safetensors")
    os.makedirs(os.path.dirname(tuned), exist_ok=True)
    xt.save_checkpoint(model, tuned)
    return rt, tuned


def write_scratch(tally, out, kind, bias=True):
    """A model built in torch from scratch (torch's default initialisation), saved for xgrad
    as DIR/scratch-KIND-tuned (checked like a tuned one); bias False: a GPT without biases."""
    torch.manual_seed(7)
    vocab = list("abcdefghij") + ["|", "<", ">"]
    c = xt.Config(kind=kind, vocabulary=vocab, context=8, d_model=16, H_q=4, H_kv=2, layers=2, d_ff=24, bias=bias)
    model = xt.build_model(c).eval()
    name = f"scratch-{kind}" + ("" if bias else "-nobias")
    if not bias:  # nothing of the biases is left in the module or in the file
        has = [n for n, _ in model.named_parameters() if n.endswith(".bias")]
        tally.check(not has, f"{name}: Config(bias=False) builds no bias parameter ({has})")
    path = os.path.join(out, f"{name}-tuned", "model.safetensors")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    xt.save_checkpoint(model, path)
    tally.check(True, f"{name}: built in torch ({c.describe()}), saved with save_checkpoint")
    return name


def roundtrip(out):
    tally = Tally()
    with open(os.path.join(out, "roundtrip.txt")) as f:
        rows = [line.split() for line in f if line.strip()]
    for name, orig_json, dtype in rows:
        if orig_json != "-":
            with open(orig_json) as f:
                orig = json.load(f)
            with open(os.path.join(out, f"{name}-rt.xgrad.json")) as f:
                rt = json.load(f)
            d = max(max(abs(a - b) for a, b in zip(x["logits"]["data"], y["logits"]["data"]))
                    for x, y in zip(orig["cases"], rt["cases"]))
            same_tokens = all(x["tokens"] == y["tokens"] for x, y in zip(orig["cases"], rt["cases"]))
            tally.check(same_tokens and d == 0.0, f"{name}: xgrad's logits of the checkpoint saved by "
                        f"save_checkpoint equal the original's exactly (max|diff| = {d:.1e})")
        # torch's logits of the saved file (float64: the exact reference) for xgrad's batches.
        with open(os.path.join(out, f"{name}-tuned.xgrad.json")) as f:
            xg_tuned = json.load(f)
        back = xt.load_checkpoint(os.path.join(out, f"{name}-tuned", "model.safetensors"), dtype=torch.float64)
        tol = TOL_F64 if dtype == "float64" else TOL
        e = max((run_case(back, k) - json_tensor(k["logits"], torch.float64)).abs().max().item()
                for k in xg_tuned["cases"])
        what = "built in torch" if name.startswith("scratch") else "trained one step in torch"
        tally.check(e <= tol, f"{name}: {what}, saved, loaded by xgrad: max|xgrad - torch| = {e:.2e} (tol {tol:g})")
    print(f"{tally.passed} passed, {tally.failed} failed")
    return 0 if tally.failed == 0 else 1


def half(path):
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)  # every 16-bit pattern
    tensors = {}
    for name, dt in (("f16_all", torch.float16), ("bf16_all", torch.bfloat16)):
        t = bits.view(dt).reshape(256, 256)
        tensors[name] = t
        tensors[name + ".expected"] = t.float()
    special = torch.tensor([0.0, -0.0, 6e-8, -6e-8, 6.1e-5, 65504.0, float("inf"), float("-inf"), float("nan"), 1 / 3])
    tensors["f16_special"] = special.to(torch.float16)
    tensors["f16_special.expected"] = tensors["f16_special"].float()
    tensors["bf16_special"] = torch.tensor([0.0, -0.0, 1e-40, -9.2e-41, 3.38e38, float("inf"), float("-inf"),
                                            float("nan"), 1 / 3]).to(torch.bfloat16)
    tensors["bf16_special.expected"] = tensors["bf16_special"].float()
    xt.save_safetensors(path, tensors)
    f16 = tensors["f16_all.expected"]
    print(f"half: wrote {path}: float16 and bfloat16, 65536 patterns each ({int(torch.isnan(f16).sum())} float16 NaNs, "
          f"{int(((f16 != 0) & (f16.abs() < 2 ** -14)).sum())} float16 subnormals)")
    return 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "roundtrip" and len(sys.argv) == 3:
        return roundtrip(sys.argv[2])
    if len(sys.argv) >= 2 and sys.argv[1] == "half" and len(sys.argv) == 3:
        return half(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["compare"])
    ap.add_argument("--out", required=True, help="folder for the round-trip checkpoints")
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
    writer_self_test(tally, a.out)
    for path in a.also_read:
        try:
            tensors, meta = xt.read_safetensors(path)
            tally.check(True, f"reads {path}: {len(tensors)} tensors, {len(meta)} metadata keys")
        except SafetensorsError as e:
            tally.check(False, f"could not read {path}: {e}")

    worst, rows = {}, []
    for i, (ckpt, logits_json) in enumerate(pairs):
        try:
            compare_checkpoint(tally, ckpt, logits_json, worst)
            name = f"case{i}"
            rt, tuned = write_round_trips(tally, ckpt, logits_json, a.out, name)
            rows.append(f"{name} {os.path.abspath(logits_json)} {xt.read_safetensors(rt)[1]['dtype']}\n")
        except (SafetensorsError, OSError, ValueError, KeyError, RuntimeError) as e:
            tally.check(False, f"{ckpt}: {type(e).__name__}: {e}")
    for kind in ("gpt", "encoder_decoder"):
        rows.append(f"{write_scratch(tally, a.out, kind)} - float32\n")
    rows.append(f"{write_scratch(tally, a.out, 'gpt', bias=False)} - float32\n")
    # A bias-free GPT's metadata says so; an encoder-decoder cannot be bias-free (xgrad's has biases).
    try:
        xt.Config(kind="encoder_decoder", V_vocab=5, context=4, d_model=8, H_q=2, bias=False)
        tally.check(False, "Config(kind='encoder_decoder', bias=False) was accepted")
    except SafetensorsError as e:
        tally.check("encoder-decoder" in str(e), f"Config(kind='encoder_decoder', bias=False) refused: {e}")
    with open(os.path.join(a.out, "roundtrip.txt"), "w") as f:
        f.writelines(rows)
    print("largest max|xgrad - torch| over all cases: " + ", ".join(
        f"{kind} {dt} checkpoints vs {k} {e:.3e}" for (kind, dt, k), e in sorted(worst.items())))
    print(f"{tally.passed} passed, {tally.failed} failed")
    return 0 if tally.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
