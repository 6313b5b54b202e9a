#!/usr/bin/python3
"""PyTorch half of the cross-check of the Llama-block ops (rms_norm, silu, swiglu).

Usage: /usr/bin/python3 llama_ops_crosscheck.py CASES.json   (written by dump_llama_ops)

Every case is rebuilt in torch float64 from the published definitions, not from xgrad's code:

RMSNorm (Zhang and Sennrich 2019; Meta's Llama reference and llama2.c): torch 1.13 has no
nn.RMSNorm, so it is written as the Llama reference writes it,
    x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
(without a weight, the last factor is left out).
SiLU: torch.nn.functional.silu. SwiGLU (Shazeer 2020, Llama's feed-forward gate): F.silu(a) * b.

Outputs and the gradients of L = sum(G * output) must agree within 1e-12 relative to
max(1, |torch|). Exit status: 0 all pass, 1 any fails, 77 (skip) without torch.
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

TOL = 1e-12


def arr(d, grad=False):
    return torch.tensor(d["data"], dtype=torch.float64).reshape(d["shape"]).requires_grad_(grad)


def rms_norm(x, weight, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def compare(name, mine, theirs, failures, worst):
    err = ((mine - theirs).abs() / theirs.abs().clamp(min=1.0)).max().item()
    worst[0] = max(worst[0], err)
    if not err <= TOL:
        failures.append(f"{name}: max |xgrad - torch| / max(1, |torch|) = {err:.3e} > {TOL}")


def main():
    if len(sys.argv) != 2:
        print("usage: llama_ops_crosscheck.py CASES.json")
        return 2
    with open(sys.argv[1]) as f:
        data = json.load(f)
    failures, worst = [], [0.0]
    kinds = set()
    for n, c in enumerate(data["cases"]):
        tag = f"case {n} ({c['kind']})"
        kinds.add(c["kind"])
        G = arr(c["G"])
        if c["kind"] == "rms_norm":
            x = arr(c["x"], True)
            w = arr(c["weight"], True) if "weight" in c else None
            y = rms_norm(x, w, c["eps"])
            wrt = [x] + ([w] if w is not None else [])
            grads = torch.autograd.grad((y * G).sum(), wrt)
            compare(tag + " y", arr(c["y"]), y.detach(), failures, worst)
            compare(tag + " dx", arr(c["dx"]), grads[0], failures, worst)
            if w is not None:
                compare(tag + " dweight", arr(c["dweight"]), grads[1], failures, worst)
        elif c["kind"] == "silu":
            x = arr(c["x"], True)
            y = F.silu(x)
            (dx,) = torch.autograd.grad((y * G).sum(), [x])
            compare(tag + " y", arr(c["y"]), y.detach(), failures, worst)
            compare(tag + " dx", arr(c["dx"]), dx, failures, worst)
        elif c["kind"] == "swiglu":
            a, b = arr(c["a"], True), arr(c["b"], True)
            y = F.silu(a) * b
            da, db = torch.autograd.grad((y * G).sum(), [a, b])
            compare(tag + " y", arr(c["y"]), y.detach(), failures, worst)
            compare(tag + " da", arr(c["da"]), da, failures, worst)
            compare(tag + " db", arr(c["db"]), db, failures, worst)
        else:
            failures.append(f"{tag}: unknown kind")
    if kinds != {"rms_norm", "silu", "swiglu"}:
        failures.append(f"expected rms_norm, silu and swiglu cases, got {sorted(kinds)}")
    for line in failures:
        print("FAILED:", line)
    print(f"llama ops cross-check: {len(data['cases'])} cases, max error {worst[0]:.3e}, "
          f"{'FAILED' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
