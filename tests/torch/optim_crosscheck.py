#!/usr/bin/python3
"""PyTorch half of the optimizer cross-check.

Usage: /usr/bin/python3 optim_crosscheck.py RUNS.json   (RUNS.json written by dump_optim)

Each run is replayed in torch float64 with the same initial parameters, the same gradient of
every step and the same learning rate of every step (set on the param group before the
step): AdamW as torch.optim.AdamW (amsgrad off, weight decay as given), Adam as
torch.optim.Adam (L2 weight decay), SGD as torch.optim.SGD (momentum, dampening 0, no
Nesterov). After every one of the 20 steps the parameters must agree with xgrad's to 1e-12
(|a - b| <= 1e-12 max(1, |b|)). The learning rates themselves are first checked against the
warmup + cosine closed form: lr_max (s + 1) / W for s < W, then
lr_min + (lr_max - lr_min)(1 + cos(pi (s - W) / (T - W))) / 2.

Exit status: 0 if every run agrees, 1 otherwise, 77 (skip) without torch.
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

TOL = 1e-12


def tensor(a):
    return torch.tensor(a["data"], dtype=torch.float64).reshape(a["shape"])


def schedule(s, sch):
    w, total, hi, lo = sch["warmup"], sch["total"], sch["lr_max"], sch["lr_min"]
    if w > 0 and s < w:
        return hi * (s + 1) / w
    if s >= total:
        return lo
    return lo + 0.5 * (hi - lo) * (1 + math.cos(math.pi * (s - w) / (total - w)))


def make(run, params, lr):
    name = run["name"]
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=tuple(run["betas"]), eps=run["eps"],
                                 weight_decay=run["weight_decay"], amsgrad=False)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=tuple(run["betas"]), eps=run["eps"],
                                weight_decay=run["weight_decay"], amsgrad=False)
    return torch.optim.SGD(params, lr=lr, momentum=run["momentum"], dampening=0,
                           weight_decay=run["weight_decay"], nesterov=False)


def main():
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    failures = 0
    sch = doc["schedule"]
    for run in doc["runs"]:
        for s, lr in enumerate(run["lr"]):
            want = schedule(s, sch)
            if abs(lr - want) > 1e-15 * max(1.0, abs(want)):
                print(f"FAILED {run['name']}: lr at step {s} is {lr!r}, closed form {want!r}")
                failures += 1
        params = [torch.nn.Parameter(tensor(a)) for a in run["init"]]
        opt = make(run, params, run["lr"][0])
        worst = 0.0
        for t, (lr, grads, after) in enumerate(zip(run["lr"], run["grads"], run["after"])):
            for g in opt.param_groups:
                g["lr"] = lr
            for p, g in zip(params, grads):
                p.grad = tensor(g)
            opt.step()
            for k, (p, a) in enumerate(zip(params, after)):
                x = tensor(a)
                err = ((p.detach() - x).abs() / x.abs().clamp(min=1.0)).max().item()
                worst = max(worst, err)
                if err > TOL:
                    print(f"FAILED {run['name']} ({run['kind']}): parameter {k} after step {t + 1} differs by {err:.3g}")
                    failures += 1
        print(f"{run['name']:>13}: {len(run['lr'])} steps, worst relative difference {worst:.3g}")
    if failures:
        print(f"FAILED: {failures} mismatches")
        return 1
    print("optimizer cross-check passed (torch " + torch.__version__ + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
