#!/usr/bin/python3
"""PyTorch half of the RoPE / ALiBi cross-check.

Usage: /usr/bin/python3 positions_crosscheck.py CASES.json   (written by dump_positions)

Every case is rebuilt in torch float64 from the published definitions, not from xgrad's code:

RoPE (Su et al. 2021, "RoFormer", eq. 34): for a head of width d, r = floor(fraction * d)
rounded down to even features rotate, pair k by theta_k = p * base^(-2k/r); the rest pass
through. Two layouts, each written the way its reference implementation writes it:
  * interleaved (the paper; Meta's LLaMA code): features (2k, 2k+1) form the complex number
    x_2k + i x_2k+1, multiplied by exp(i theta_k) (torch.view_as_complex, torch.polar);
  * half-split (GPT-NeoX): x * cos + rotate_half(x) * sin, with rotate_half(x) = [-x2, x1]
    for x = [x1, x2] split in halves and cos, sin repeated over both halves.

ALiBi (Press et al. 2022): head h adds -m_h * (i - j) to the score of query i and key j;
the slopes m come from the paper's get_slopes (below, as published). For keys after the
query (bidirectional use, not in the paper) xgrad's documented rule is -m_h * |i - j|.

Attention: P = X W_QKV + b_QKV (weights x-by-out), Q | K | V heads, RoPE on Q and K at
positions 0 .. T-1, S = Q K^T / sqrt(d_h) + ALiBi, causal -inf above the diagonal, softmax,
O = A V (GQA: K and V repeated per query group), Y = concat(O) W_O + b_O.

Outputs and the gradients of L = sum(G * output) must agree within 1e-10.
Exit status: 0 all pass, 1 any fails, 77 (skip) without torch.
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

TOL = 1e-10


def arr(d, grad=False):
    return torch.tensor(d["data"], dtype=torch.float64).reshape(d["shape"]).requires_grad_(grad)


def rotary_dims(d, fraction):
    r = int(math.floor(fraction * d))
    return r - r % 2


def angles(positions, r, base):
    inv_freq = 1.0 / (base ** (torch.arange(0, r, 2, dtype=torch.float64) / r))  # [r/2]
    return torch.outer(torch.tensor(positions, dtype=torch.float64), inv_freq)  # [T, r/2]


def rope_interleaved(x, positions, base, fraction):
    d = x.shape[-1]
    r = rotary_dims(d, fraction)
    rot, rest = x[..., :r], x[..., r:]
    z = torch.view_as_complex(rot.reshape(*rot.shape[:-1], r // 2, 2).contiguous())
    theta = angles(positions, r, base)
    z = z * torch.polar(torch.ones_like(theta), theta)
    return torch.cat([torch.view_as_real(z).flatten(-2), rest], dim=-1)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([-x2, x1], dim=-1)


def rope_half_split(x, positions, base, fraction):
    d = x.shape[-1]
    r = rotary_dims(d, fraction)
    rot, rest = x[..., :r], x[..., r:]
    theta = angles(positions, r, base)
    emb = torch.cat([theta, theta], dim=-1)  # [T, r]
    return torch.cat([rot * emb.cos() + rotate_half(rot) * emb.sin(), rest], dim=-1)


def rope(x, positions, cfg):
    f = rope_interleaved if cfg["layout"] == "interleaved" else rope_half_split
    return f(x, positions, cfg["base"], cfg["fraction"])


def get_slopes(n):
    """ALiBi head slopes, as in the paper's reference code."""
    def get_slopes_power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio ** i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]


def mha(c, X, W_QKV, b_QKV, W_O, b_O):
    B, T, d = X.shape
    H_q, H_kv = c["H_q"], c["H_kv"]
    d_h = d // H_q
    P = X @ W_QKV + b_QKV
    q, k, v = torch.split(P, [H_q * d_h, H_kv * d_h, H_kv * d_h], dim=-1)
    heads = lambda t, H: t.reshape(B, T, H, d_h).permute(0, 2, 1, 3)
    Q, K, V = heads(q, H_q), heads(k, H_kv), heads(v, H_kv)
    pos = list(range(T))
    if c["rope"] is not None:
        Q, K = rope(Q, pos, c["rope"]), rope(K, pos, c["rope"])
    r = H_q // H_kv
    K, V = K.repeat_interleave(r, dim=1), V.repeat_interleave(r, dim=1)
    S = Q @ K.transpose(-1, -2) / math.sqrt(d_h)
    i = torch.arange(T, dtype=torch.float64)
    if c["alibi"]:
        m = torch.tensor(get_slopes(H_q), dtype=torch.float64)
        S = S - m[:, None, None] * (i[:, None] - i[None, :]).abs()
    if c["causal"]:
        S = S.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    O = torch.softmax(S, dim=-1) @ V
    return O.permute(0, 2, 1, 3).reshape(B, T, H_q * d_h) @ W_O + b_O


def compare(name, mine, theirs, failures, worst):
    err = (mine - theirs).abs().max().item()
    worst[0] = max(worst[0], err)
    if not err <= TOL:
        failures.append(f"{name}: max |xgrad - torch| = {err:.3e} > {TOL}")


def main():
    if len(sys.argv) != 2:
        print("usage: positions_crosscheck.py CASES.json")
        return 2
    with open(sys.argv[1]) as f:
        data = json.load(f)
    failures, worst = [], [0.0]
    for n, c in enumerate(data["cases"]):
        tag = f"case {n} ({c['kind']})"
        if c["kind"] == "rope":
            x = arr(c["x"], True)
            y = rope(x, c["positions"], c["rope"])
            (dx,) = torch.autograd.grad((y * arr(c["G"])).sum(), [x])
            compare(tag + " y", arr(c["y"]), y.detach(), failures, worst)
            compare(tag + " dx", arr(c["dx"]), dx, failures, worst)
        else:
            names = ["W_QKV", "b_QKV", "W_O", "b_O"]
            X = arr(c["X"], True)
            params = [arr(c[k], True) for k in names]
            Y = mha(c, X, *params)
            grads = torch.autograd.grad((Y * arr(c["G"])).sum(), [X] + params)
            compare(tag + " Y", arr(c["Y"]), Y.detach(), failures, worst)
            for k, g in zip(["X"] + names, grads):
                compare(tag + " d" + k, arr(c["d" + k]), g, failures, worst)
    for line in failures:
        print("FAILED:", line)
    print(f"positions cross-check ({data['impl']}): {len(data['cases'])} cases, max error {worst[0]:.3e}, "
          f"{'FAILED' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
