#!/usr/bin/python3
"""PyTorch half of the sliding-window cross-check.

Usage: /usr/bin/python3 window_crosscheck.py CASES.json   (written by dump_window)

Each case is rebuilt in torch float64 from the published definition of sliding-window causal
attention, with nothing taken from xgrad but the inputs:

    allowed[b, h, i, j] = q_pos[i] - W < k_pos[j] <= q_pos[i]  and  j < key_lengths[b]
    O = softmax(Q K^T * scale, masked to -inf where not allowed) V

with query head h reading key/value head h // (H_q / H_kv) (torch repeat_interleave). The
output and the gradients of L = sum(cotangent * O) with respect to Q, K and V must agree
with xgrad's to 1e-10 (absolute) or 1e-9 (relative).

Exit status: 0 if every case passes, 1 if any fails, 77 (skip) without torch.
"""
import json
import sys

SKIP = 77
try:
    import torch
except ImportError:
    print("SKIPPED: python3-torch is not installed (apt-get install python3-torch)")
    sys.exit(SKIP)

ABS_TOL = 1e-10
REL_TOL = 1e-9


def arr(d):
    return torch.tensor(d["data"], dtype=torch.float64).reshape(d["shape"])


def allowed_set(c):
    q = torch.tensor(c["q_pos"], dtype=torch.int64).view(-1, 1)  # [T, 1]
    k = torch.tensor(c["k_pos"], dtype=torch.int64).view(1, -1)  # [1, S]
    window = (k <= q) & (k > q - c["W"])  # [T, S]
    j = torch.arange(c["S"]).view(1, -1)
    lengths = torch.tensor(c["key_lengths"], dtype=torch.int64).view(-1, 1)  # [B, 1]
    padding = j < lengths  # [B, S]
    return window.view(1, 1, c["T"], c["S"]) & padding.view(c["B"], 1, 1, c["S"])  # [B, 1, T, S]


def reference(c):
    Q = arr(c["Q"]).requires_grad_(True)
    K = arr(c["K"]).requires_grad_(True)
    V = arr(c["V"]).requires_grad_(True)
    r = c["H_q"] // c["H_kv"]
    Kr = K.repeat_interleave(r, dim=1)
    Vr = V.repeat_interleave(r, dim=1)
    scores = torch.matmul(Q, Kr.transpose(-1, -2)) * c["scale"]
    scores = scores.masked_fill(~allowed_set(c), float("-inf"))
    O = torch.matmul(torch.softmax(scores, dim=-1), Vr)
    (O * arr(c["cotangent"])).sum().backward()
    return {"output": O.detach(), "dQ": Q.grad, "dK": K.grad, "dV": V.grad}


def main():
    with open(sys.argv[1]) as f:
        data = json.load(f)
    failures = 0
    worst = 0.0
    for n, c in enumerate(data["cases"]):
        ref = reference(c)
        for name in ("output", "dQ", "dK", "dV"):
            mine = arr(c[name])
            if list(mine.shape) != list(ref[name].shape):
                print(f"FAIL case {n} ({c['layout']}): {name} shape {list(mine.shape)} vs torch {list(ref[name].shape)}")
                failures += 1
                continue
            diff = (mine - ref[name]).abs()
            bound = ABS_TOL + REL_TOL * ref[name].abs()
            worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
            if bool((diff > bound).any()):
                print(f"FAIL case {n} ({c['layout']}, T {c['T']}, S {c['S']}, W {c['W']}): {name} differs by "
                      f"{float(diff.max()):.3g}")
                failures += 1
    print(f"window_crosscheck: {len(data['cases'])} cases, outputs and Q/K/V gradients, largest difference "
          f"{worst:.3g}; {'all passed' if failures == 0 else str(failures) + ' failures'}")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: window_crosscheck.py CASES.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main())
