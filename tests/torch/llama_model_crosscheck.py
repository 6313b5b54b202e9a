#!/usr/bin/python3
"""PyTorch half of the cross-check of the Llama model (nn::GPT with arch llama).

Usage: /usr/bin/python3 llama_model_crosscheck.py CASES.json   (written by dump_llama_model)

Each case is a small random Llama model with xgrad's parameters (in x out: y = x W). It is
rebuilt here in torch float64 from the published Llama architecture (Touvron et al. 2023;
Meta's reference model.py and llama2.c's model.py), not from xgrad's code:

    h = tok[tokens]
    for each layer:
        x = RMSNorm(h) * attn_norm          RMSNorm(x) = x * rsqrt(mean(x^2, -1) + eps)
        q, k, v = x Wq, x Wk, x Wv          (xgrad packs them as W_QKV = [Wq | Wk | Wv])
        q, k = RoPE(q), RoPE(k)             per head, at positions 0 .. T-1
        k, v repeated H_q / H_kv times      (grouped-query attention, heads in groups)
        h = h + softmax(q k^T / sqrt(d_h) + causal [and window] mask) v Wo
        x = RMSNorm(h) * ffn_norm
        h = h + (silu(x W1) * (x W3)) W2    (W1 = gate, W3 = up, W2 = down)
    logits = (RMSNorm(h) * norm) C^T        C = tok (tied) or the separate classifier

RoPE interleaved (Meta, llama2.c): features (2i, 2i+1) of the first r are one complex number,
multiplied by e^(i p theta_i), theta_i = base^(-2i/r). Half-split (Hugging Face, GPT-NeoX):
x cos + rotate_half(x) sin with the angles repeated over the two halves. The rest pass through.
torch 1.13 has no F.scaled_dot_product_attention: attention is written out by hand.

The logits and the gradient of L = sum(G * logits) with respect to every parameter must agree
within 1e-10 relative to max(1, |torch|); the same model run by xgrad in float32 (its weights
rounded to float32) within TOL32 = 1e-4 of the float64 torch values, on the same scale. Exit status: 0 all pass, 1 any fails, 77 (skip)
without torch.
"""
import json
import sys

SKIP = 77
try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIPPED: python3-torch is not installed (apt-get install python3-torch)")
    sys.exit(SKIP)

TOL = 1e-10
TOL32 = 1e-4


def arr(d, grad=False):
    return torch.tensor(d["data"], dtype=torch.float64).reshape(d["shape"]).requires_grad_(grad)


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotary_dims(d, fraction):
    r = int(fraction * d)
    return r - r % 2


def rope(x, cfg):
    """x [B, H, T, d_h] rotated at positions 0 .. T-1."""
    T, d = x.shape[-2], x.shape[-1]
    r = rotary_dims(d, cfg["rope_fraction"])
    inv_freq = 1.0 / (cfg["rope_base"] ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    theta = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)  # [T, r/2]
    rot, rest = x[..., :r], x[..., r:]
    if cfg["rope_layout"] == "interleaved":
        z = torch.view_as_complex(rot.reshape(*rot.shape[:-1], r // 2, 2).contiguous())
        z = z * torch.polar(torch.ones_like(theta), theta)
        rot = torch.view_as_real(z).flatten(-2)
    else:
        emb = torch.cat([theta, theta], dim=-1)
        half = r // 2
        rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
        rot = rot * emb.cos() + rotated * emb.sin()
    return torch.cat([rot, rest], dim=-1)


def forward(cfg, P, tokens):
    B, T = tokens.shape
    d, H_q, H_kv = cfg["d_model"], cfg["H_q"], cfg["H_kv"]
    d_h = d // H_q
    eps = cfg["norm_eps"]
    i = torch.arange(T).unsqueeze(1)
    j = torch.arange(T).unsqueeze(0)
    visible = j <= i
    if cfg["window"] > 0:
        visible = visible & (j > i - cfg["window"])
    h = P["tok.weight"][tokens]
    for layer in range(cfg["layers"]):
        p = f"blocks.{layer}."
        x = rms_norm(h, P[p + "attn_norm.weight"], eps)
        W = P[p + "attn.W_QKV"]
        Wq, Wk, Wv = W[:, : H_q * d_h], W[:, H_q * d_h: (H_q + H_kv) * d_h], W[:, (H_q + H_kv) * d_h:]
        q = (x @ Wq).reshape(B, T, H_q, d_h).transpose(1, 2)
        k = (x @ Wk).reshape(B, T, H_kv, d_h).transpose(1, 2)
        v = (x @ Wv).reshape(B, T, H_kv, d_h).transpose(1, 2)
        q, k = rope(q, cfg), rope(k, cfg)
        k = k.repeat_interleave(H_q // H_kv, dim=1)
        v = v.repeat_interleave(H_q // H_kv, dim=1)
        scores = q @ k.transpose(-1, -2) / d_h ** 0.5
        scores = scores.masked_fill(~visible, float("-inf"))
        o = torch.softmax(scores, dim=-1) @ v
        h = h + o.transpose(1, 2).reshape(B, T, H_q * d_h) @ P[p + "attn.W_O"]
        x = rms_norm(h, P[p + "ffn_norm.weight"], eps)
        h = h + (F.silu(x @ P[p + "ffn.gate.W"]) * (x @ P[p + "ffn.up.W"])) @ P[p + "ffn.down.W"]
    C = P["tok.weight"] if cfg["tied"] else P["classifier.weight"]
    return rms_norm(h, P["norm.weight"], eps) @ C.T


def expected_names(cfg):
    names = {"tok.weight", "norm.weight"}
    for layer in range(cfg["layers"]):
        for n in ("attn_norm.weight", "attn.W_QKV", "attn.W_O", "ffn_norm.weight", "ffn.gate.W", "ffn.up.W",
                  "ffn.down.W"):
            names.add(f"blocks.{layer}.{n}")
    if not cfg["tied"]:
        names.add("classifier.weight")
    return names


def compare(name, mine, theirs, failures, worst, tol=TOL):
    if mine.shape != theirs.shape:
        failures.append(f"{name}: shape {list(mine.shape)} vs torch {list(theirs.shape)}")
        return
    err = ((mine - theirs).abs() / theirs.abs().clamp(min=1.0)).max().item()
    worst[0] = max(worst[0], err)
    if not err <= tol:
        failures.append(f"{name}: max |xgrad - torch| / max(1, |torch|) = {err:.3e} > {tol}")


def main():
    if len(sys.argv) != 2:
        print("usage: llama_model_crosscheck.py CASES.json")
        return 2
    with open(sys.argv[1]) as f:
        data = json.load(f)
    failures, worst, worst32 = [], [0.0], [0.0]
    seen = set()
    for n, c in enumerate(data["cases"]):
        cfg = c["config"]
        tag = (f"case {n} (H_q {cfg['H_q']}, H_kv {cfg['H_kv']}, {'tied' if cfg['tied'] else 'untied'}, "
               f"{cfg['rope_layout']}, window {cfg['window']})")
        seen.add((cfg["H_kv"] < cfg["H_q"], cfg["tied"]))
        if set(c["params"]) != expected_names(cfg):
            failures.append(f"{tag}: parameter names {sorted(c['params'])} are not the Llama names")
            continue
        P = {name: arr(v, True) for name, v in c["params"].items()}
        tokens = torch.tensor(c["tokens"]["data"], dtype=torch.long).reshape(c["tokens"]["shape"])
        logits = forward(cfg, P, tokens)
        names = sorted(P)
        grads = torch.autograd.grad((logits * arr(c["G"])).sum(), [P[k] for k in names])
        compare(tag + " logits", arr(c["logits"]), logits.detach(), failures, worst)
        for name, g in zip(names, grads):
            compare(f"{tag} d {name}", arr(c["grads"][name]), g, failures, worst)
        compare(tag + " float32 logits", arr(c["logits_f32"]), logits.detach(), failures, worst32, TOL32)
        for name, g in zip(names, grads):
            compare(f"{tag} float32 d {name}", arr(c["grads_f32"][name]), g, failures, worst32, TOL32)
    if not {(True, True), (True, False)} <= seen:
        failures.append("expected GQA cases both tied and untied")
    for line in failures:
        print("FAILED:", line)
    print(f"llama model cross-check: {len(data['cases'])} cases, max error {worst[0]:.3e} "
          f"(float32: {worst32[0]:.3e}), "
          f"{'FAILED' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
