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

What --check compares is the polynomials, not the digits. The least squares go through NumPy's
LAPACK and BLAS, whose kernels differ from CPU to CPU, and a degree-6 fit on an interval of
width 1/4 is ill-conditioned: on an Intel Xeon whose OpenBLAS runs its Prescott core the fit
gives 27 of the 112 float32 coefficients a few to 439 units in the last place away from a
SkylakeX core's, yet the two tables' polynomials differ by at most 1e-5 ulp of erf. So the check
passes when, on each interval, the source's polynomial and the fit's agree within POLY_TOL ulp of
erf (0.001: a change of one unit in the last place of c0 to c3 moves them by 0.01-1 ulp), and
the source's own table, through the kernel's float32 arithmetic, is within BOUND ulp of double
erf on the evaluated inputs (1.08, the bound over all 2^32 inputs).
"""
import argparse
import math
import re
import sys

import numpy as np

WIDTH, INTERVALS, DEGREE = 0.25, 16, 6
POLY_TOL, BOUND = 0.001, 1.08  # --check: ulp of erf
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


def read_table(source):
    """The kErfC table of a C++ source as [interval, coefficient] float32, or None."""
    start = source.find("constexpr float kErfC[%d][%d]" % (DEGREE + 1, INTERVALS))
    end = source.find("};", start) if start >= 0 else -1
    if end < 0:
        return None
    body = source[source.find("=", start) + 1:end]
    vals = re.findall(r"(-?[0-9]+\.[0-9]+e[-+][0-9]+)f", body)
    if len(vals) != (DEGREE + 1) * INTERVALS:
        return None
    return np.array([float(v) for v in vals], dtype=f32).reshape(DEGREE + 1, INTERVALS).T


def poly(c, i, t):
    """Interval i's polynomial with float32 coefficients c, in float64 (erf(i/4 + t))."""
    c = c.astype(np.float64)
    if i == 0:
        return t + t * sum(c[k] * t ** (k - 1) for k in range(1, DEGREE + 1))
    return sum(c[k] * t ** k for k in range(DEGREE + 1))


def ulp32(y):
    """One unit in the last place of float32 at |y| (the smallest subnormal at 0)."""
    r = np.abs(y).astype(f32)
    return np.maximum((np.nextafter(r, f32(np.inf)) - r).astype(np.float64), float(np.nextafter(f32(0), f32(1))))


def poly_gap(a, b):
    """Per interval, the largest difference of the two tables' polynomials in ulp of erf."""
    t = np.linspace(0, WIDTH, 20001)
    return [float(np.max(np.abs(poly(a[i], i, t) - poly(b[i], i, t)) / ulp32(poly(a[i], i, t))))
            for i in range(INTERVALS)]


def errors(coef, x, ref):
    """Per interval, the largest error in ulp of the kernel's float32 arithmetic with coef."""
    err = np.abs(kernel(coef, x).astype(np.float64) - ref) / ulp32(ref)
    where = np.minimum(np.floor(x * 4), 15).astype(int)
    return [float(err[where == i].max()) for i in range(INTERVALS)]


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
    for i, e in enumerate(errors(coef, x, ref)):  # this fit's table (the one printed)
        print(f"// interval {i:2d}: at most {e:.3f} ulp", file=sys.stderr)
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
    theirs = read_table(source)
    if theirs is None:
        print(f"fit_erf.py: no kErfC[{DEGREE + 1}][{INTERVALS}] table of {(DEGREE + 1) * INTERVALS} numbers in "
              f"{args.check}", file=sys.stderr)
        return 1
    gap, own = poly_gap(theirs, coef), errors(theirs, x, ref)
    differ = int(np.count_nonzero(theirs != coef))
    worst = int(np.argmax(gap))
    print(f"fit_erf.py: {differ} of {theirs.size} coefficients differ in their digits from this fit's; the "
          f"polynomials differ by at most {gap[worst]:.3g} ulp of erf (interval {worst}; at most {POLY_TOL} "
          f"allowed); the source's table errs by at most {max(own):.3f} ulp (at most {BOUND} allowed), every "
          f"{args.stride}th float32 of [0, 4.5]")
    if gap[worst] > POLY_TOL:
        print(f"fit_erf.py: the table in {args.check} is not the one this fit gives:\n{text}", file=sys.stderr)
        return 1
    if max(own) > BOUND:
        print(f"fit_erf.py: the table in {args.check} errs by {max(own):.3f} ulp, more than {BOUND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
