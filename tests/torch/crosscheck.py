#!/usr/bin/python3
"""PyTorch half of the xgrad cross-check (SPEC 12).

Usage: /usr/bin/python3 crosscheck.py CASES.json   (CASES.json written by dump_attention)

Every case is rebuilt in torch float64 from the inputs xgrad used; the output and the
gradients of L = sum(cotangent * output) are compared with xgrad's. Everything that can
differ between two frameworks is aligned explicitly: parameters and their layout (torch
stores Linear weights [out, in]), biases, the scale, mask polarity (below), positions of
the causal triangle, and dropout (off on both sides).

Mask polarity. The JSON always stores masks as 1 = ALLOWED. torch does not agree with
itself, which is exactly what this test must get right:
  * F.scaled_dot_product_attention, bool attn_mask:  True = ALLOWED (may attend);
  * nn.MultiheadAttention, bool attn_mask and key_padding_mask: True = NOT allowed
    (forbidden / padding to ignore).
Each call site below converts at its boundary.

Invalid queries. xgrad defines the output row of an invalid (padding) query as exactly zero,
with zero gradient everywhere. torch has no such notion: its rows get a non-empty mask
(all keys allowed, so no NaN) and their output rows are replaced by zero with torch.where
before the loss, which gives them zero gradient too.

Exit status: 0 if every case passes, 1 if any fails, 77 (skip) without torch.
"""
import json
import math
import sys

SKIP = 77
try:
    import torch
except ImportError:
    print("SKIPPED: python3-torch is not installed (apt-get install python3-torch)")
    sys.exit(SKIP)
import torch.nn.functional as F

# float64 on both sides, tiny sizes: differences are a few ulps of the values involved.
ABS_TOL = 1e-10
REL_TOL = 1e-9


def _find_torch_sdpa():
    """torch's fused SDPA when it exists and takes `scale` (torch >= 2.1), else None."""
    f = getattr(F, "scaled_dot_product_attention", None)
    if f is None:
        return None
    try:
        z = torch.zeros(1, 1, 1, 1, dtype=torch.float64)
        f(z, z, z, attn_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool), dropout_p=0.0, scale=1.0)
    except TypeError:
        return None
    return f


TORCH_SDPA = _find_torch_sdpa()


def arr(d):
    return torch.tensor(d["data"], dtype=torch.float64).reshape(d["shape"])


def leaf(d):
    return arr(d).requires_grad_(True)


def bools(d):
    return torch.tensor(d["data"], dtype=torch.bool).reshape(d["shape"])


def allowed_set(masks, B, H, T, S, with_lengths=True):
    """[B, H, T, S] bool, True = ALLOWED: the random mask & causal & key lengths."""
    allowed = torch.ones(B, H, T, S, dtype=torch.bool)
    if masks["allowed"] is not None:
        m = bools(masks["allowed"])  # file polarity: 1 = allowed
        if m.dim() == 2:
            m = m.view(1, 1, T, S)
        allowed = allowed & m
    if masks["causal"]:
        # Queries are the last T of S positions: query i sits at S - T + i (bottom-right).
        i = torch.arange(T).view(T, 1)
        j = torch.arange(S).view(1, S)
        allowed = allowed & (j <= i + (S - T)).view(1, 1, T, S)
    if with_lengths and masks["key_lengths"] is not None:
        lens = torch.tensor(masks["key_lengths"]).view(B, 1)
        allowed = allowed & (torch.arange(S).view(1, S) < lens).view(B, 1, 1, S)
    return allowed


def query_valid(masks, B, T):
    if masks["query_valid"] is None:
        return torch.ones(B, T, dtype=torch.bool)
    return bools(masks["query_valid"])


def attend(q, k, v, allowed, scale):
    """softmax(q k^T * scale, over the ALLOWED keys) v; allowed is bool, True = allowed."""
    if TORCH_SDPA is not None:
        # F.scaled_dot_product_attention: a bool attn_mask means True = ALLOWED.
        return TORCH_SDPA(q, k, v, attn_mask=allowed, dropout_p=0.0, scale=scale)
    u = (q @ k.transpose(-2, -1)) * scale
    u = u.masked_fill(~allowed, float("-inf"))
    return torch.softmax(u, dim=-1) @ v


def zero_invalid_rows(o, valid):
    """o [B, H, T, d]: rows of invalid queries become exact zeros (xgrad's definition)."""
    B, T = valid.shape
    return torch.where(valid.view(B, 1, T, 1), o, torch.zeros((), dtype=o.dtype))


def check_invalid_rows_zero(out_xgrad, valid):
    """xgrad must output EXACT zeros on invalid query rows ([B, H, T, d] layout)."""
    bad = out_xgrad[~valid.view(valid.shape[0], 1, valid.shape[1]).expand(-1, out_xgrad.shape[1], -1)]
    return bad.numel() == 0 or bool((bad == 0).all())


# ----------------------------------------------------------------------------- categories
# Each returns (torch output, {name: torch tensor whose .grad to compare}) after backward.


def run_sdpa(case):
    """sdpa and gqa: K and V heads repeated with repeat_interleave (query head h reads kv head h // r)."""
    c, masks, inp = case["config"], case["masks"], case["inputs"]
    B, Hq, Hkv, T, S = c["B"], c["H_q"], c["H_kv"], c["T"], c["S"]
    r = Hq // Hkv
    scale = c["scale"] if c["scale"] is not None else 1.0 / math.sqrt(c["d_k"])
    q, k, v = leaf(inp["Q"]), leaf(inp["K"]), leaf(inp["V"])
    valid = query_valid(masks, B, T)
    allowed = allowed_set(masks, B, Hq, T, S)
    allowed = allowed | ~valid.view(B, 1, T, 1)  # invalid rows: any non-empty set
    o = attend(q, k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1), allowed, scale)
    o = zero_invalid_rows(o, valid)
    (o * arr(case["cotangent"])).sum().backward()
    extra = None
    if not check_invalid_rows_zero(arr(case["output"]), valid):
        extra = "xgrad output is not exactly zero on an invalid query row"
    return o, {"Q": q, "K": k, "V": v}, extra


def run_mha(case):
    c, masks, inp = case["config"], case["masks"], case["inputs"]
    B, T, d, H = c["B"], c["T"], c["d_model"], c["H"]
    mha = torch.nn.MultiheadAttention(d, H, dropout=0.0, bias=True, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(arr(inp["in_proj_weight"]))
        mha.in_proj_bias.copy_(arr(inp["in_proj_bias"]))
        mha.out_proj.weight.copy_(arr(inp["out_proj_weight"]))
        mha.out_proj.bias.copy_(arr(inp["out_proj_bias"]))
    x = leaf(inp["X"])
    # nn.MultiheadAttention's bool masks mean True = NOT allowed (the opposite of F.sdpa).
    key_padding_mask = None
    if masks["key_lengths"] is not None:
        lens = torch.tensor(masks["key_lengths"]).view(B, 1)
        key_padding_mask = torch.arange(T).view(1, T) >= lens  # True = padding, ignored
    attn_mask = None
    if masks["allowed"] is not None or masks["causal"]:
        allowed = allowed_set(masks, B, H, T, T, with_lengths=False)
        if masks["allowed"] is not None and len(masks["allowed"]["shape"]) == 4:
            attn_mask = ~allowed.reshape(B * H, T, T)  # [B * H, T, S], True = forbidden
        else:
            attn_mask = ~allowed[0, 0]  # [T, S], True = forbidden
    y, _ = mha(x, x, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask, need_weights=False)
    (y * arr(case["cotangent"])).sum().backward()
    return y, {"X": x, "in_proj_weight": mha.in_proj_weight, "in_proj_bias": mha.in_proj_bias,
               "out_proj_weight": mha.out_proj.weight, "out_proj_bias": mha.out_proj.bias}, None


def run_cross(case):
    """Cross-attention by hand: weights in torch layout [out, in], W_KV rows = [K heads | V heads]."""
    c, masks, inp = case["config"], case["masks"], case["inputs"]
    B, T, S, Hq, Hkv, dh = c["B"], c["T"], c["S"], c["H_q"], c["H_kv"], c["d_head"]
    p = {n: leaf(inp[n]) for n in ("X_q", "X_m", "W_Q", "b_Q", "W_KV", "b_KV", "W_O", "b_O")}
    q = F.linear(p["X_q"], p["W_Q"], p["b_Q"]).view(B, T, Hq, dh).transpose(1, 2)
    k, v = F.linear(p["X_m"], p["W_KV"], p["b_KV"]).chunk(2, dim=-1)
    k = k.reshape(B, S, Hkv, dh).transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    v = v.reshape(B, S, Hkv, dh).transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    valid = query_valid(masks, B, T)
    allowed = allowed_set(masks, B, Hq, T, S) | ~valid.view(B, 1, T, 1)
    o = zero_invalid_rows(attend(q, k, v, allowed, 1.0 / math.sqrt(dh)), valid)
    y = F.linear(o.transpose(1, 2).reshape(B, T, Hq * dh), p["W_O"], p["b_O"])
    (y * arr(case["cotangent"])).sum().backward()
    return y, p, None


def run_gqa_layer(case):
    """GQA/MQA self-attention with four torch nn.Linear layers holding the exported weights."""
    c, masks, inp = case["config"], case["masks"], case["inputs"]
    B, T, d, Hq, Hkv, dh = c["B"], c["T"], c["d_model"], c["H_q"], c["H_kv"], c["d_head"]
    lin = {n: torch.nn.Linear(i, o, dtype=torch.float64)
           for n, i, o in (("q", d, Hq * dh), ("k", d, Hkv * dh), ("v", d, Hkv * dh), ("o", Hq * dh, d))}
    with torch.no_grad():
        for n, m in lin.items():
            m.weight.copy_(arr(inp[n + ".weight"]))
            m.bias.copy_(arr(inp[n + ".bias"]))
    x = leaf(inp["X"])
    q = lin["q"](x).view(B, T, Hq, dh).transpose(1, 2)
    k = lin["k"](x).view(B, T, Hkv, dh).transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    v = lin["v"](x).view(B, T, Hkv, dh).transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    o = attend(q, k, v, allowed_set(masks, B, Hq, T, T), 1.0 / math.sqrt(dh))
    y = lin["o"](o.transpose(1, 2).reshape(B, T, Hq * dh))
    (y * arr(case["cotangent"])).sum().backward()
    leaves = {"X": x}
    for n, m in lin.items():
        leaves[n + ".weight"], leaves[n + ".bias"] = m.weight, m.bias
    return y, leaves, None


def run_cross_mha(case):
    """Cross attention through torch.nn.MultiheadAttention(kdim = vdim = d_m)."""
    c, masks, inp = case["config"], case["masks"], case["inputs"]
    B, T, S, E, H, dm = c["B"], c["T"], c["S"], c["d_q"], c["H"], c["d_m"]
    mha = torch.nn.MultiheadAttention(E, H, dropout=0.0, bias=True, batch_first=True, kdim=dm, vdim=dm,
                                      dtype=torch.float64)
    weights = ["in_proj_weight"] if c["packed"] else ["q_proj_weight", "k_proj_weight", "v_proj_weight"]
    if c["packed"] != (mha.in_proj_weight is not None):
        return None, {}, f"torch packs q/k/v {'' if mha.in_proj_weight is not None else 'not '}for kdim {dm}, embed_dim {E}"
    with torch.no_grad():
        for n in weights + ["in_proj_bias"]:
            getattr(mha, n).copy_(arr(inp[n]))
        mha.out_proj.weight.copy_(arr(inp["out_proj_weight"]))
        mha.out_proj.bias.copy_(arr(inp["out_proj_bias"]))
    xq, xm = leaf(inp["X_q"]), leaf(inp["X_m"])
    # nn.MultiheadAttention's bool masks: True = NOT allowed (padding to ignore / forbidden).
    key_padding_mask = torch.arange(S).view(1, S) >= torch.tensor(masks["key_lengths"]).view(B, 1)
    attn_mask = None
    if masks["allowed"] is not None:
        attn_mask = ~bools(masks["allowed"])  # [T, S]
    y, _ = mha(xq, xm, xm, key_padding_mask=key_padding_mask, attn_mask=attn_mask, need_weights=False)
    (y * arr(case["cotangent"])).sum().backward()
    leaves = {"X_q": xq, "X_m": xm, "in_proj_bias": mha.in_proj_bias, "out_proj_weight": mha.out_proj.weight,
              "out_proj_bias": mha.out_proj.bias}
    for n in weights:
        leaves[n] = getattr(mha, n)
    return y, leaves, None


RUNNERS = {"sdpa": run_sdpa, "gqa": run_sdpa, "mha": run_mha, "cross": run_cross, "gqa_layer": run_gqa_layer,
           "cross_mha": run_cross_mha}


def compare(name, xgrad_json, ref):
    """(max abs error, ok, detail of the worst element) for one array."""
    x = arr(xgrad_json)
    if ref is None:  # torch's .grad stays None when its graph never reached the input
        return math.inf, False, f"{name}: torch produced no gradient (the reference graph does not reach it)"
    r = ref.detach()
    if tuple(x.shape) != tuple(r.shape):
        return math.inf, False, f"{name}: shape xgrad {tuple(x.shape)} vs torch {tuple(r.shape)}"
    if x.numel() == 0:
        return 0.0, True, ""
    diff = (x - r).abs()
    bad = ~(diff <= ABS_TOL + REL_TOL * r.abs())  # also catches NaN
    flat = int(torch.argmax(torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)))
    idx, rest = [], flat
    for n in reversed(x.shape):
        idx.insert(0, rest % n)
        rest //= n
    worst = diff.reshape(-1)[flat].item()
    detail = (f"{name}{idx}: torch {r.reshape(-1)[flat].item():.17g} "
              f"xgrad {x.reshape(-1)[flat].item():.17g}")
    return (worst if not math.isnan(worst) else math.inf), not bool(bad.any()), detail


def describe(case):
    c, m = case["config"], case["masks"]
    keys = [k for k in ("B", "H", "H_q", "H_kv", "T", "S", "d_model", "d_q", "d_m", "d_head", "d_k", "d_v", "d_out",
                        "packed")
            if k in c]
    s = " ".join(f"{k}={c[k]}" for k in keys)
    if c.get("scale") is not None:
        s += f" scale={c['scale']:.4g}"
    flags = []
    if m["causal"]:
        flags.append("causal")
    if m["allowed"] is not None:
        flags.append("mask" + "x".join(str(n) for n in m["allowed"]["shape"]))
    if m["key_lengths"] is not None:
        flags.append("lens=" + ",".join(str(n) for n in m["key_lengths"]))
    if m["query_valid"] is not None:
        n_invalid = sum(1 for v in m["query_valid"]["data"] if not v)
        flags.append(f"invalid_rows={n_invalid}")
    return s + (" [" + " ".join(flags) + "]" if flags else "")


def main():
    if len(sys.argv) != 2:
        print("usage: crosscheck.py CASES.json", file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        cases = json.load(f)["cases"]
    print(f"torch {torch.__version__}; reference attention: "
          f"{'F.scaled_dot_product_attention' if TORCH_SDPA else 'explicit masked softmax'}; "
          f"tolerance |xgrad - torch| <= {ABS_TOL:g} + {REL_TOL:g} |torch|")
    passed = failed = 0
    worst_by_cat = {}
    count_by_cat = {}
    for case in cases:
        cat = case["category"]
        count_by_cat[cat] = count_by_cat.get(cat, 0) + 1
        problems = []
        max_err = 0.0
        try:
            out, leaves, extra = RUNNERS[cat](case)
            if extra:
                problems.append(extra)
            results = [compare("output", case["output"], out)]
            for name, xg in case["grads"].items():
                results.append(compare("grad " + name, xg, leaves[name].grad))
            for err, ok, detail in results:
                max_err = max(max_err, err)
                if not ok:
                    problems.append(detail)
        except Exception as e:  # a crash in one case is that case's failure
            problems.append(f"exception: {type(e).__name__}: {e}")
            max_err = math.inf
        worst_by_cat[cat] = max(worst_by_cat.get(cat, 0.0), max_err)
        status = "FAIL" if problems else "PASS"
        print(f"{cat:5s} case {case['id']:3d}  max_abs_err {max_err:.3e}  {status}  {describe(case)}")
        for p in problems:
            print(f"      {p}")
        if problems:
            failed += 1
        else:
            passed += 1
    if not cases:
        print("no cases in the input file")
        failed += 1
    for cat in count_by_cat:
        print(f"category {cat}: {count_by_cat[cat]} cases, max abs error {worst_by_cat[cat]:.3e}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
