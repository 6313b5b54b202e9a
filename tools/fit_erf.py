#!/usr/bin/python3
"""The coefficients of xgrad's 16-lane float32 erf (core/vmath.cpp, kErfC): how they were made.

erf(|x|) on [0, 4] is cut into 16 intervals of width 1/4; on interval i, with t = |x| - i/4,

    i = 0:      erf = t + t (r1 + r2 t + ... + r6 t^5)     (x exact, the small term rounds)
    i >= 1:     erf = c0 + c1 t + ... + c6 t^6

Each polynomial is fitted by least squares on 3000 Chebyshev points of its interval, reweighted
60 times (Lawson's method) towards the largest error, which it drives towards equal ripples: the
error of erf itself, relative on the first interval (tiny arguments keep their digits) and
absolute on the others (erf is near 1 there). The coefficients are rounded to float32; the
program then evaluates the kernel's float32 arithmetic (a fused multiply-add rounds once) on
every STRIDE-th float32 bit pattern of [0, 4.5] and prints the largest error in ulp per interval
(stride 13: 83 million values, 8 GB and 40 s; at most 1.056 ulp). The kernel itself was checked
over all 2^32 inputs against double erf: at most 1.08 ulp.

Needs NumPy (never needed to build or use xgrad). Prints the C++ table, or with --check compares
it with the one in core/vmath.cpp (exit 1 when they differ; a ctest runs that):

    /usr/bin/python3 tools/fit_erf.py [--stride 13] [--check core/vmath.cpp]
"""
import argparse
import math
import sys

import numpy as np

WIDTH, INTERVALS, DEGREE = 0.25, 16, 6
f32 = np.float32
erf = np.vectorize(math.erf)


def lawson(V, target, weight, rounds=60):
    """Coefficients c minimising max |(V c - target) weight|, approximately."""
    w = np.ones(len(target))
    for _ in range(rounds):
        c, *_ = np.linalg.lstsq(V * (w * weight)[:, None], target * w * weight, rcond=None)
        err = np.abs((V @ c - target) * weight)
        w = w * (err / err.max() + 0.02) ** 0.5
        w /= w.max()
    return c


def fit():
    coef = np.zeros((INTERVALS, DEGREE + 1), dtype=f32)
    for i in range(INTERVALS):
        t = np.cos(np.linspace(0, np.pi, 3000)) * (-WIDTH / 2) + WIDTH / 2
        if i == 0:
            t = t[t > 1e-9]
            r = erf(t) / t - 1  # erf = t (1 + r)
            c = lawson(np.vander(t, DEGREE, increasing=True), r, 1 / (1 + r))
            coef[i, 0], coef[i, 1:] = 0, c.astype(f32)
        else:
            c = lawson(np.vander(t, DEGREE + 1, increasing=True), erf(i * WIDTH + t), np.ones_like(t))
            coef[i] = c.astype(f32)
    return coef


def fma(a, b, c):  # one rounding, as the kernel's
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(f32)


def kernel(coef, x):
    """The float32 arithmetic of core/vmath.cpp's Erf16 on the array x."""
    x = x.astype(f32)
    ac = np.minimum(np.abs(x), f32(4))
    fl = np.minimum(np.floor(ac * f32(4)), f32(15)).astype(f32)
    i = fl.astype(np.int32)
    t = fma(fl, np.full_like(fl, -0.25), ac)
    p = coef[i, DEGREE]
    for k in range(DEGREE - 1, 0, -1):
        p = fma(p, t, coef[i, k])
    base = fma(t, (i == 0).astype(f32), coef[i, 0])
    return np.copysign(fma(p, t, base), x)


def table(coef):
    lines = ["alignas(64) constexpr float kErfC[7][16] = {"]
    for k in range(DEGREE + 1):
        vals = ["%.9ef" % v for v in coef[:, k]]
        rows = [", ".join(vals[j:j + 4]) for j in range(0, INTERVALS, 4)]
        lines.append("    {\n     " + ",\n     ".join(rows) + "},")
    lines.append("};")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description="fit the coefficients of xgrad's float32 erf")
    ap.add_argument("--stride", type=int, default=13, help="evaluate every STRIDE-th float32 of [0, 4.5]")
    ap.add_argument("--check", metavar="SOURCE", help="compare the table with the one in SOURCE (core/vmath.cpp)")
    args = ap.parse_args()
    if args.stride < 1:
        ap.error(f"--stride must be at least 1, got {args.stride}")
    coef = fit()
    x = np.arange(1, np.float32(4.5).view(np.int32), args.stride, dtype=np.int32).view(f32)
    ref = erf(x.astype(np.float64))
    r = np.abs(ref).astype(f32)
    ulp = (np.nextafter(r, f32(np.inf)) - r).astype(np.float64)
    err = np.abs(kernel(coef, x).astype(np.float64) - ref) / ulp
    where = np.minimum(np.floor(x * 4), 15).astype(int)
    for i in range(INTERVALS):
        print(f"// interval {i:2d}: at most {err[where == i].max():.3f} ulp", file=sys.stderr)
    text = table(coef)
    if not args.check:
        print(text)
        return 0
    try:
        with open(args.check, encoding="utf-8") as f:
            source = f.read()
    except OSError as e:
        print(f"fit_erf.py: cannot read {args.check}: {e.strerror}", file=sys.stderr)
        return 1
    start = source.find(text.split("\n")[0])
    end = source.find("};", start) + 2 if start >= 0 else -1
    if start < 0 or source[start:end] != text:
        print(f"fit_erf.py: the table in {args.check} is not the one this fit gives:\n{text}", file=sys.stderr)
        return 1
    print(f"fit_erf.py: the table in {args.check} is the fit's ({err.max():.3f} ulp at most, every "
          f"{args.stride}th float32 of [0, 4.5])")
    return 0


if __name__ == "__main__":
    sys.exit(main())
