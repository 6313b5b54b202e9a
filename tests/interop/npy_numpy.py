#!/usr/bin/python3
"""NumPy half of the .npy/.npz interop test (run by run_npy.sh with npy_interop).

Usage:
  npy_numpy.py write DIR    NumPy writes .npy/.npz files into DIR, and DIR/manifest.json says,
                            per file, the arrays xgrad must read (dtype, shape, every value as
                            exact text) or the FormatError text it must raise.
  npy_numpy.py verify DIR   NumPy reads the files `npy_interop write DIR` wrote and compares
                            them with values computed here from the same formulas; each .npy
                            must also be byte for byte what np.save writes for those values.

Written by NumPy: float32/float64/int64 in many shapes (scalar, empty, 1-d, 5-d), special
values (NaN, +-inf, -0.0, subnormals, the largest finite), format versions 1.0, 2.0 and 3.0,
a non-contiguous slice (NumPy saves it in C order), archives from np.savez and
np.savez_compressed (deflate with dynamic and fixed Huffman blocks, and level-0 stored
blocks), a zip64 archive, and everything xgrad must refuse: Fortran order, big-endian,
int32, float16, bool, strings, structured and pickled object arrays, bzip2/lzma members,
non-.npy members, damaged CRC, truncated files.

Exit status: 0 if everything passed, 1 otherwise, 77 (skip) without NumPy.
"""
import io
import json
import math
import os
import struct
import sys
import zipfile

try:
    import numpy as np
except ImportError:
    print(f"SKIPPED: numpy is not importable by {sys.executable} (apt-get install python3-numpy)")
    sys.exit(77)


def exact_text(x, dtype):
    """A value as text that reads back exactly (strtod / strtoll in C++)."""
    if dtype == "int64":
        return str(int(x))
    x = float(x)  # float32 -> float64 is exact
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


def describe(a):
    a = np.asarray(a)
    dt = {np.dtype("<f4"): "float32", np.dtype("<f8"): "float64", np.dtype("<i8"): "int64"}[a.dtype]
    return {"dtype": dt, "shape": list(a.shape), "data": [exact_text(v, dt) for v in a.reshape(-1, order="C")]}


def write(d):
    rng = np.random.default_rng(20240917)
    manifest = []

    def ok(name, arrays):
        manifest.append({"file": name, "expect": "ok", "arrays": {k: describe(v) for k, v in arrays.items()}})

    def bad(name, error):
        manifest.append({"file": name, "expect": "error", "error": error})

    def path(name):
        return os.path.join(d, name)

    f32 = rng.standard_normal((2, 3)).astype("<f4")
    f64_special = np.array([np.nan, np.inf, -np.inf, -0.0, 5e-324, 2.2250738585072014e-308,
                            np.finfo("<f8").max, 1.0 / 3.0], dtype="<f8")
    f32_special = np.array([np.nan, np.inf, -np.inf, -0.0, 2.0 ** -149, 2.0 ** -126, np.finfo("<f4").max,
                            np.float32(1.0) / np.float32(3.0)], dtype="<f4")
    i64 = np.array([[0, -1, 2 ** 63 - 1], [-(2 ** 63), 2 ** 53 + 1, 42]], dtype="<i8")
    singles = {
        "f32_2x3.npy": f32,
        "f64_special.npy": f64_special,
        "f32_special.npy": f32_special,
        "i64_extremes.npy": i64,
        "f64_scalar.npy": np.float64(-2.5),
        "f32_empty_0x3.npy": np.zeros((0, 3), dtype="<f4"),
        "i64_empty.npy": np.zeros((0,), dtype="<i8"),
        "f64_5d.npy": rng.standard_normal((2, 1, 3, 1, 2)),
        "f32_long.npy": rng.standard_normal(1000).astype("<f4"),
        # A strided view: NumPy writes it in C order (fortran_order False).
        "f64_slice.npy": rng.standard_normal((4, 6))[:, ::2],
    }
    for name, a in singles.items():
        np.save(path(name), a)
        ok(name, {"": a})
    for version in ((2, 0), (3, 0)):
        name = f"f64_version_{version[0]}_0.npy"
        a = rng.standard_normal((3, 2))
        with open(path(name), "wb") as f:
            np.lib.format.write_array(f, a, version=version)
        ok(name, {"": a})

    # What xgrad must refuse, with the text of its FormatError.
    refuse = {
        "fortran_2x3.npy": (np.asfortranarray(f32), "Fortran (column-major) order"),
        "transposed_3x2.npy": (f32.T, "Fortran (column-major) order"),
        "big_endian_f8.npy": (f64_special.astype(">f8"), "'>f8' is big-endian float64"),
        "big_endian_f4.npy": (f32.astype(">f4"), "'>f4' is big-endian float32"),
        "big_endian_i8.npy": (i64.astype(">i8"), "'>i8' is big-endian int64"),
        "int32.npy": (np.arange(6, dtype="<i4"), "dtype '<i4' (int32) is not supported"),
        "float16.npy": (np.ones(3, dtype="<f2"), "dtype '<f2' (float16) is not supported"),
        "bool.npy": (np.array([True, False]), "dtype '|b1' (bool) is not supported"),
        "uint8.npy": (np.arange(4, dtype=np.uint8), "dtype '|u1' (uint8) is not supported"),
        "strings.npy": (np.array(["ab", "c"]), "(string) is not supported"),
        "structured.npy": (np.zeros(2, dtype=[("a", "<f4"), ("b", "<i8")]), "structured dtypes"),
    }
    for name, (a, error) in refuse.items():
        np.save(path(name), a)
        bad(name, error)
    np.save(path("object.npy"), np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    bad("object.npy", "object: pickled Python objects")
    with open(path("f32_2x3.npy"), "rb") as f:
        good = f.read()
    with open(path("truncated.npy"), "wb") as f:
        f.write(good[:-5])
    bad("truncated.npy", "truncated: shape (2, 3) of <f4 needs 24 data bytes, the file has 19")
    with open(path("trailing.npy"), "wb") as f:
        f.write(good + b"\0")
    bad("trailing.npy", "1 trailing bytes after the 24 data bytes")
    with open(path("bad_magic.npy"), "wb") as f:
        f.write(b"\x93NUMPZ" + good[6:])
    bad("bad_magic.npy", "not a .npy file")
    with open(path("header_cut.npy"), "wb") as f:
        f.write(good[:40])
    bad("header_cut.npy", "truncated: the header length is 118 bytes, only 30 follow")

    # Archives.
    mixed = {"weights": f32, "special": f64_special, "ids": i64, "scalar": np.float64(7.0),
             "empty": np.zeros((0,), dtype="<f8")}
    np.savez(path("savez.npz"), rng.standard_normal(3), **mixed)  # positional -> arr_0
    with np.load(path("savez.npz")) as z:
        ok("savez.npz", {k: z[k] for k in z.files})
    big = {"noise": rng.standard_normal((64, 33)).astype("<f4"),
           "ramp": np.arange(5000, dtype="<f8") % 17,  # long repeats: far back-references
           "ids": (np.arange(3000, dtype="<i8") * 7919) % 50}
    np.savez_compressed(path("savez_compressed.npz"), **big, tiny=np.array([1.5]))
    ok("savez_compressed.npz", {**big, "tiny": np.array([1.5])})
    # Deflate at level 0 (stored blocks inside deflate) and 1, written member by member.
    for level in (0, 1):
        name = f"deflate_level{level}.npz"
        with zipfile.ZipFile(path(name), "w", compression=zipfile.ZIP_DEFLATED, compresslevel=level) as zf:
            for k, v in big.items():
                with zf.open(k + ".npy", "w") as f:
                    np.lib.format.write_array(f, v)
        ok(name, big)
    # The deflate members must cover all three block kinds: stored (0), fixed (1), dynamic (2).
    kinds = set()
    for name in ("savez_compressed.npz", "deflate_level0.npz", "deflate_level1.npz"):
        with open(path(name), "rb") as f:
            blob = f.read()
        for info in zipfile.ZipFile(path(name)).infolist():
            n, e = struct.unpack("<HH", blob[info.header_offset + 26:info.header_offset + 30])
            kinds.add((blob[info.header_offset + 30 + n + e] >> 1) & 3)
    assert kinds == {0, 1, 2}, f"deflate block kinds written: {sorted(kinds)}, expected stored, fixed and dynamic"
    # zip64 records for a small archive: lower zipfile's limits while writing.
    saved = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 16, 1
    try:
        np.savez(path("zip64.npz"), **mixed)
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = saved
    with open(path("zip64.npz"), "rb") as f:
        blob = f.read()
    assert b"PK\x06\x06" in blob and b"PK\x06\x07" in blob, "zipfile did not write zip64 records"
    ok("zip64.npz", mixed)

    def member_archive(name, members, compression=zipfile.ZIP_STORED):
        with zipfile.ZipFile(path(name), "w", compression=compression) as zf:
            for k, v in members.items():
                if isinstance(v, bytes):
                    zf.writestr(k, v)
                else:
                    with zf.open(k, "w") as f:
                        np.lib.format.write_array(f, v)

    member_archive("bzip2.npz", {"a.npy": f32}, zipfile.ZIP_BZIP2)
    bad("bzip2.npz", "member 'a.npy': uses compression method 12 (bzip2)")
    member_archive("lzma.npz", {"a.npy": f32}, zipfile.ZIP_LZMA)
    bad("lzma.npz", "member 'a.npy': uses compression method 14 (lzma)")
    member_archive("not_npy_member.npz", {"a.npy": f32, "readme.txt": b"hello"})
    bad("not_npy_member.npz", "member 'readme.txt': is not a .npy member")
    np.savez(path("fortran_member.npz"), ok=f32, f=np.asfortranarray(f32))
    bad("fortran_member.npz", "member 'f.npy': the array is stored in Fortran")
    np.savez_compressed(path("int32_member.npz"), a=np.arange(3, dtype="<i4"))
    bad("int32_member.npz", "member 'a.npy': dtype '<i4' (int32) is not supported")
    # A damaged byte in stored data (CRC) and in compressed data (deflate or CRC).
    with open(path("savez.npz"), "rb") as f:
        z = bytearray(f.read())
    at = z.index(b"\x93NUMPY") + 140
    z[at] ^= 0x40
    with open(path("crc.npz"), "wb") as f:
        f.write(z)
    bad("crc.npz", "CRC-32 is")
    with open(path("savez_compressed.npz"), "rb") as f:
        z = bytearray(f.read())
    z[200] ^= 0xFF
    with open(path("deflate_damaged.npz"), "wb") as f:
        f.write(z)
    bad("deflate_damaged.npz", "member 'noise.npy': ")
    with open(path("truncated.npz"), "wb") as f:
        f.write(z[: len(z) // 2])
    bad("truncated.npz", "no end-of-central-directory record")
    bad("f32_2x3.npy.as_npz", "this is a .npy file, not an .npz archive")
    with open(path("f32_2x3.npy.as_npz"), "wb") as f:
        f.write(good)

    with open(path("manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"numpy {np.__version__} wrote {len(manifest)} files into {d} "
          f"({sum(m['expect'] == 'ok' for m in manifest)} to read, {sum(m['expect'] == 'error' for m in manifest)} to refuse)")
    return 0


# The formulas npy_interop.cpp writes with (kept independent: nothing is read from its files
# to compute the expected values).
def ramp(shape, dtype):
    n = math.prod(shape)
    v = [((i * 7919) % 1000 - 500) / 64.0 for i in range(n)]
    return np.array(v, dtype=dtype).reshape(shape)


def expected_from_cpp():
    f64_special = np.array([np.nan, np.inf, -np.inf, -0.0, 5e-324, np.finfo("<f8").max], dtype="<f8")
    f32_special = np.array([np.nan, np.inf, -np.inf, -0.0, 2.0 ** -149, np.finfo("<f4").max], dtype="<f4")
    ids = np.array([[0, -1, 2 ** 63 - 1], [-(2 ** 63), 2 ** 53 + 1, 42]], dtype="<i8")
    npy = {
        "cpp_f32_2x3.npy": ramp((2, 3), "<f4"),
        "cpp_f64_4.npy": ramp((4,), "<f8"),
        "cpp_f64_scalar.npy": np.array(ramp((1,), "<f8")[0]),
        "cpp_f32_empty.npy": np.zeros((0, 5), dtype="<f4"),
        "cpp_f64_special.npy": f64_special,
        "cpp_f32_special.npy": f32_special,
        "cpp_i64.npy": ids,
        "cpp_f32_3d.npy": ramp((3, 4, 5), "<f4"),
    }
    npz = {"w": ramp((3, 4), "<f4"), "b": ramp((4,), "<f8"), "ids": ids, "special": f64_special,
           "empty": np.zeros((0,), dtype="<i8"), "naïve/μ": ramp((2,), "<f8")}
    return npy, npz


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.tobytes() == b.tobytes()  # bitwise: NaN, -0.0 and subnormals included


def verify(d):
    npy, npz = expected_from_cpp()
    failed = 0

    def check(cond, line):
        nonlocal failed
        print(("  ok    " if cond else "  FAIL  ") + line)
        failed += 0 if cond else 1

    for name, want in npy.items():
        p = os.path.join(d, name)
        got = np.load(p)
        check(same(got, want), f"np.load({name}): {got.dtype} {got.shape} equals the expected values bit for bit")
        buf = io.BytesIO()
        np.save(buf, want)
        with open(p, "rb") as f:
            raw = f.read()
        check(raw == buf.getvalue(), f"{name} is byte for byte what np.save writes ({len(raw)} bytes)")
    p = os.path.join(d, "cpp.npz")
    with zipfile.ZipFile(p) as zf:
        check(zf.testzip() is None, "cpp.npz: zipfile.testzip() finds every CRC-32 correct")
        infos = zf.infolist()
        check(all(i.compress_type == zipfile.ZIP_STORED for i in infos), "cpp.npz: every member is stored")
        check([i.filename for i in infos] == [k + ".npy" for k in npz], f"cpp.npz members in order: {[i.filename for i in infos]}")
    with np.load(p) as z:
        check(list(z.files) == list(npz), f"np.load(cpp.npz).files == {list(npz)}")
        for k, want in npz.items():
            check(k in z.files and same(z[k], want), f"cpp.npz[{k!r}] equals the expected values bit for bit")
    print(f"verify: {failed} failure(s)")
    return 1 if failed else 0


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "verify"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    os.makedirs(sys.argv[2], exist_ok=True)
    return write(sys.argv[2]) if sys.argv[1] == "write" else verify(sys.argv[2])


if __name__ == "__main__":
    sys.exit(main())
