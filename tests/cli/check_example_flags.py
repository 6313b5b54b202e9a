#!/usr/bin/env python3
"""The example programs take flags like the xgrad program does (CLI11): a bad flag is one line
"<program>: <message> (see '<program> --help')" on stderr and exit status 2, before any work;
--help exits 0.

    check_example_flags.py BINDIR
"""
import os
import subprocess
import sys

CASES = [  # program, arguments, expected exit status, key words of stderr (or stdout on success)
    ("tiny_gpt", ["--steps", "abc"], 2, ["--steps", "abc"]),
    ("tiny_gpt", ["--steps", "-1"], 2, ["--steps", "-1"]),
    ("tiny_gpt", ["--steps", "0"], 2, ["--steps", "0"]),
    ("tiny_gpt", ["--steps", ""], 2, ["--steps"]),
    ("tiny_gpt", ["--steps", "1.5"], 2, ["--steps", "1.5"]),
    ("tiny_gpt", ["--steps", "1000001"], 2, ["--steps", "1000001"]),
    ("tiny_gpt", ["--steps"], 2, ["--steps"]),
    ("tiny_gpt", ["--seed", "-1"], 2, ["--seed", "-1"]),
    ("tiny_gpt", ["--seed", "99999999999999999999"], 2, ["--seed", "out of range"]),
    ("tiny_gpt", ["--min-accuracy", "2"], 2, ["--min-accuracy"]),
    ("tiny_gpt", ["--min-accuracy", ""], 2, ["--min-accuracy"]),
    ("tiny_gpt", ["--min-accuracy", "nan"], 2, ["--min-accuracy"]),
    ("tiny_gpt", ["--bogus"], 2, ["--bogus"]),
    ("tiny_gpt", ["extra"], 2, ["extra"]),
    ("tiny_gpt", ["--help"], 0, ["--steps", "--seed", "--min-accuracy"]),
    ("tiny_gpt", ["--steps", "1"], 0, ["held-out exact match"]),
    ("gradient_penalty", ["--steps", "59"], 2, ["--steps", "59"]),
    ("gradient_penalty", ["--steps", "abc"], 2, ["--steps", "abc"]),
    ("gradient_penalty", ["--lambda", "nan"], 2, ["--lambda"]),
    ("gradient_penalty", ["--lambda", "-1"], 2, ["--lambda"]),
    ("gradient_penalty", ["--seed", "-1"], 2, ["--seed", "-1"]),
    ("gradient_penalty", ["--bogus"], 2, ["--bogus"]),
    ("gradient_penalty", ["--help"], 0, ["--steps", "--seed", "--lambda"]),
    ("custom_layer", ["--bogus"], 2, ["--bogus"]),
    ("custom_layer", ["--seed", "-1"], 2, ["--seed", "-1"]),
    ("custom_layer", ["--seed", ""], 2, ["--seed"]),
    ("custom_layer", ["--dtype", "float16"], 2, ["--dtype"]),
    ("custom_layer", ["--filter", "no-such-check"], 2, ["no check matches", "no-such-check"]),
    ("custom_layer", ["--list"], 0, ["rms_norm"]),
    ("kv_cache_check", ["--bug", "bogus"], 2, ["--bug", "bogus"]),
    ("kv_cache_check", ["--bug"], 2, ["--bug"]),
    ("kv_cache_check", ["--list"], 0, ["tiny_decoder/kv-cache", "kv-cache"]),
]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    bindir = os.path.abspath(sys.argv[1])
    failures = []
    for program, args, want, words in CASES:
        r = subprocess.run([os.path.join(bindir, program)] + args, capture_output=True, text=True, timeout=300)
        what = f"{program} {' '.join(repr(a) for a in args)}"
        problems = []
        if r.returncode != want:
            problems.append(f"exit {r.returncode}, expected {want}")
        text = r.stdout if want == 0 else r.stderr
        if want != 0:
            lines = r.stderr.strip("\n").split("\n")
            if len(lines) != 1 or not lines[0].startswith(program + ": ") or f"(see '{program} --help')" not in lines[0]:
                problems.append(f"stderr is not one line '{program}: ... (see '{program} --help')'")
            if r.stdout:
                problems.append("wrote to stdout")
        for w in words:
            if w.lower() not in text.lower():
                problems.append(f"key word {w!r} missing")
        if problems:
            failures.append(f"{what}: {'; '.join(problems)}\n    stdout: {r.stdout[:300]!r}\n    stderr: {r.stderr[:300]!r}")
    for f in failures:
        print("FAILED", f)
    print(f"example flags: {len(CASES)} cases, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
