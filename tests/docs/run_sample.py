#!/usr/bin/env python3
"""Runs one program extracted from the documentation and checks what the document claims.

Usage: run_sample.py --where DOC:LINE [--expect REGEX]... -- PROGRAM [ARGS...]
Passes when PROGRAM exits with status 0 within the time limit and its standard output
contains a match of every REGEX (Python syntax, multi-line mode).
"""
import re
import subprocess
import sys


def main(argv):
    where, expects, i = "?", [], 1
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--where":
            where = argv[i + 1]
        elif argv[i] == "--expect":
            expects.append(argv[i + 1])
        else:
            print(f"run_sample.py: unknown argument {argv[i]}")
            return 2
        i += 2
    cmd = argv[i + 1:]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        print(f"FAILED: the program of {where} did not finish in 600 s")
        return 1
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr)
    ok = True
    if p.returncode != 0:
        print(f"FAILED: the program of {where} exited with status {p.returncode}")
        ok = False
    for e in expects:
        if not re.search(e, p.stdout, re.MULTILINE):
            print(f"FAILED: the output of the program of {where} does not match <!-- expect: {e} -->")
            ok = False
    if ok:
        print(f"the program of {where} ran as documented ({len(expects)} expected pattern(s) found)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
