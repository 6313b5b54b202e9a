#!/usr/bin/python3
"""PyTorch half of the Hessian cross-check.

Usage: /usr/bin/python3 hessian_crosscheck.py CASES.json   (written by dump_hessian)

Each case's loss is rebuilt in torch float64 from its definition (not from xgrad's code) and
differentiated twice by torch.autograd.functional.hessian; xgrad's Hessian (xg::hessian) must
agree within 1e-10 elementwise, and the loss within 1e-12.

  mlp_params / mlp_input: logits = tanh(X W1 + b1) W2 + b2 (weights in xgrad's x-by-out
    layout), loss = mean over rows of -log softmax(logits)[target]; the point is theta =
    [W1, b1, W2, b2] flattened row-major, or X.
  attn_x / attn_wqkv: one self-attention layer, the loss sum(Y * G):
    P = X W_QKV + b_QKV with W_QKV [d_model, (H_q + 2 H_kv) d_head], columns [Q heads | K heads |
    V heads], each block head-major; heads split features: [B, T, H d] -> [B, H, T, d].
    RoPE (Su et al. 2021) on Q and K at positions 0 .. T-1, theta_k = p base^(-2k/r): the
    interleaved layout rotates pairs (2k, 2k+1) as complex numbers (LLaMA's view_as_complex),
    the half-split layout is x cos + rotate_half(x) sin (GPT-NeoX).
    GQA: query head h reads key/value head h // (H_q / H_kv) (repeat_interleave).
    S = Q K^T / sqrt(d_head), causal -inf above the diagonal, softmax, O = A V,
    Y = concat_h(O) W_O + b_O. The point is X, or W_QKV.
Exit status: 0 all pass, 1 any fails, 77 (skip) without torch.
"""
import json
import math
import sys

SKIP = 77
try:
    import torch
    from torch.autograd.functional import hessian
except ImportError:
    print("SKIPPED: python3-torch is not installed (apt-get install python3-torch)")
    sys.exit(SKIP)

TOL_H = 1e-10
TOL_LOSS = 1e-12


def arr(d):
    return torch.tensor(d["data"], dtype=torch.float64).reshape(d["shape"])


def mlp_loss(X, W1, b1, W2, b2, targets):
    logits = torch.tanh(X @ W1 + b1) @ W2 + b2
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return -logp.gather(1, targets[:, None]).mean()


def rotary_dims(d, fraction):
    r = int(math.floor(fraction * d))
    return r - r % 2


def rope(x, cfg):
    T, d = x.shape[-2], x.shape[-1]
    r = rotary_dims(d, cfg["fraction"])
    rot, rest = x[..., :r], x[..., r:]
    inv_freq = 1.0 / (cfg["base"] ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    theta = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)  # [T, r/2]
    if cfg["layout"] == "interleaved":
        z = torch.view_as_complex(rot.reshape(*rot.shape[:-1], r // 2, 2).contiguous())
        z = z * torch.polar(torch.ones_like(theta), theta)
        rot = torch.view_as_real(z).flatten(-2)
    else:
        emb = torch.cat([theta, theta], dim=-1)
        half = torch.cat([-rot[..., r // 2:], rot[..., : r // 2]], dim=-1)
        rot = rot * emb.cos() + half * emb.sin()
    return torch.cat([rot, rest], dim=-1)


def attention(c, X, W_QKV, b_QKV, W_O, b_O):
    B, T, _ = X.shape
    H_q, H_kv, d_h = c["H_q"], c["H_kv"], c["d_head"]
    P = X @ W_QKV + b_QKV
    q, k, v = torch.split(P, [H_q * d_h, H_kv * d_h, H_kv * d_h], dim=-1)
    heads = lambda t, H: t.reshape(B, T, H, d_h).permute(0, 2, 1, 3)
    Q, K, V = rope(heads(q, H_q), c["rope"]), rope(heads(k, H_kv), c["rope"]), heads(v, H_kv)
    group = H_q // H_kv
    K, V = K.repeat_interleave(group, dim=1), V.repeat_interleave(group, dim=1)
    S = Q @ K.transpose(-1, -2) / math.sqrt(d_h)
    S = S.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    O = torch.softmax(S, dim=-1) @ V
    return O.permute(0, 2, 1, 3).reshape(B, T, H_q * d_h) @ W_O + b_O


def loss_function(c):
    kind = c["kind"]
    if kind.startswith("mlp"):
        X, W1, b1, W2, b2 = (arr(c[k]) for k in ["X", "W1", "b1", "W2", "b2"])
        targets = torch.tensor(c["targets"]["data"], dtype=torch.int64)
        if kind == "mlp_input":
            return lambda x: mlp_loss(x, W1, b1, W2, b2, targets)
        shapes = [W1.shape, b1.shape, W2.shape, b2.shape]

        def of_theta(theta):
            parts, o = [], 0
            for s in shapes:
                n = math.prod(s)
                parts.append(theta[o:o + n].reshape(s))
                o += n
            return mlp_loss(X, *parts, targets)

        return of_theta
    X, G = arr(c["X"]), arr(c["G"])
    W = {k: arr(c[k]) for k in ["W_QKV", "b_QKV", "W_O", "b_O"]}
    if kind == "attn_x":
        return lambda x: (attention(c, x, W["W_QKV"], W["b_QKV"], W["W_O"], W["b_O"]) * G).sum()
    return lambda w: (attention(c, X, w, W["b_QKV"], W["W_O"], W["b_O"]) * G).sum()


def main():
    if len(sys.argv) != 2:
        print("usage: hessian_crosscheck.py CASES.json")
        return 2
    with open(sys.argv[1]) as f:
        data = json.load(f)
    failures, worst = [], 0.0
    expected_kinds = ["mlp_params", "mlp_input", "attn_x", "attn_wqkv"]
    kinds = [c["kind"] for c in data["cases"]]
    if kinds != expected_kinds:
        failures.append(f"cases {kinds}, expected {expected_kinds}")
    for c in data["cases"]:
        f = loss_function(c)
        point = arr(c["point"])
        loss = f(point).item()
        if not abs(loss - c["loss"]) <= TOL_LOSS:
            failures.append(f"{c['kind']} loss: xgrad {c['loss']:.17g}, torch {loss:.17g}")
        H = hessian(f, point)
        mine = arr(c["H"])
        if mine.shape != H.shape:
            failures.append(f"{c['kind']}: Hessian shape {tuple(mine.shape)}, torch {tuple(H.shape)}")
            continue
        err = (mine - H).abs().max().item()
        worst = max(worst, err)
        scale = H.abs().max().item()
        print(f"{c['kind']}: Hessian {tuple(H.shape)}, max |H| {scale:.3e}, max |xgrad - torch| {err:.3e}")
        if not scale > 0:
            failures.append(f"{c['kind']}: torch's Hessian is zero (the case checks nothing)")
        if not err <= TOL_H:
            failures.append(f"{c['kind']}: max |xgrad - torch| = {err:.3e} > {TOL_H}")
    for line in failures:
        print("FAILED:", line)
    print(f"Hessian cross-check ({data['impl']}): {len(data['cases'])} cases, max error {worst:.3e}, "
          f"{'FAILED' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
