#!/usr/bin/env python3
"""docs/math.md restates every number the repository cites, and its citation table is current.

Usage: check_math_citations.py SOURCE_DIR [--write]

Citations, in any text file of the repository but docs/math.md (see docs/math.md, "How to
read a number in the code"): equations `(5.N)`, ranges `(5.N)-(5.M)` and lists `(5.N, 5.M)`
(so "the text after (5.22)" cites (5.22)); `Algorithm 5.1` and `Algorithm 5.1 step N`;
`Exercise 5.N` (also `exercise`, `exercises 5.N and 5.M`, `ex. 5.N`); `Figure 5.N`; and the
design digest's sections `SPEC N`, `SPEC N.M`, ranges `SPEC N-M` and lists `SPEC N, M`.

Fails when a cited number has no restatement in docs/math.md (a heading, or for the
algorithm's steps the step list), or when the table under "Where each number is cited"
differs from the citations found; --write rewrites that table.
"""
import os
import re
import subprocess
import sys

MATH = "docs/math.md"
SELF = "tests/docs/check_math_citations.py"


def repository_files(root):
    p = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if p.returncode == 0:
        return sorted(f for f in p.stdout.decode("utf-8").split("\0") if f)
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames
                       if d != ".git" and not os.path.exists(os.path.join(dirpath, d, "CMakeCache.txt"))]
        files += [os.path.relpath(os.path.join(dirpath, n), root) for n in filenames if n != ".git"]
    return sorted(files)


def spec_keys(text):
    """`SPEC 6-8, 11` -> SPEC 6, 7, 8, 11; `SPEC 1.1, 4.6` -> SPEC 1.1, 4.6."""
    keys = []
    for m in re.finditer(r"\bSPEC\s+(\d+(?:\.\d+)?(?:\s*-\s*\d+)?(?:\s*,\s*\d+(?:\.\d+)?(?:\s*-\s*\d+)?)*)", text):
        for part in re.split(r"\s*,\s*", m.group(1)):
            r = re.match(r"(\d+)\s*-\s*(\d+)$", part)
            if r:
                keys += [f"SPEC {k}" for k in range(int(r.group(1)), int(r.group(2)) + 1)]
            else:
                keys.append(f"SPEC {part}")
    return keys


def citations(text):
    keys = set()
    for m in re.finditer(r"\(5\.(\d+)\)\s*[-\u2013]\s*\(5\.(\d+)\)", text):
        keys.update(f"({5}.{k})" for k in range(int(m.group(1)), int(m.group(2)) + 1))
    for m in re.finditer(r"(?<![\w])\(5\.(\d+)(?![\d.])", text):
        keys.add(f"(5.{m.group(1)})")
    for m in re.finditer(r"\(5\.\d+,\s*5\.(\d+)\)", text):
        keys.add(f"(5.{m.group(1)})")
    for m in re.finditer(r"\bAlgorithm 5\.1\b(\s+steps?\s+(\d+)(?:\s*-\s*(\d+))?)?", text):
        if m.group(1):
            last = int(m.group(3) or m.group(2))
            keys.update(f"Algorithm 5.1 step {k}" for k in range(int(m.group(2)), last + 1))
        else:
            keys.add("Algorithm 5.1")
    for m in re.finditer(r"\b(?:[Ee]xercises?|ex\.)\s+5\.(\d+)((?:\s*(?:,|and)\s*5\.\d+)*)", text):
        keys.add(f"Exercise 5.{m.group(1)}")
        keys.update(f"Exercise 5.{k}" for k in re.findall(r"5\.(\d+)", m.group(2)))
    for m in re.finditer(r"\bFigures?\s+5\.(\d+)", text):
        keys.add(f"Figure 5.{m.group(1)}")
    keys.update(spec_keys(text))
    return keys


def sort_key(key):
    kinds = ["(", "Algorithm", "Exercise", "Figure", "SPEC"]
    kind = next(i for i, k in enumerate(kinds) if key.startswith(k))
    return (kind, [int(x) for x in re.findall(r"\d+", key)])


def restated(key, math_text):
    """Whether docs/math.md restates `key` (a heading for it, or the algorithm's step)."""
    headings = [line for line in math_text.split("\n") if line.startswith("#")]
    if key.startswith("(5."):
        return any(re.match(r"^#+ " + re.escape(key), h) for h in headings)
    if key == "Algorithm 5.1":
        return any("Algorithm 5.1" in h for h in headings)
    m = re.match(r"Algorithm 5\.1 step (\d+)$", key)
    if m:
        return f"**Step {m.group(1)} (SPEC 4.{m.group(1)})" in math_text
    if key.startswith(("Exercise", "Figure")):
        return any(re.match(r"^#+ " + re.escape(key) + r"\b", h) for h in headings)
    m = re.match(r"SPEC (\d+)(?:\.(\d+))?$", key)
    if m and not m.group(2):
        return any(re.match(rf"^## SPEC {m.group(1)} \u2014", h) for h in headings)
    if m:  # an item of a section: a heading naming it, or an algorithm step
        return any(key in h for h in headings) or f"(SPEC {key[5:]})" in math_text or f"{key} " in math_text
    return False


def table(cited):
    rows = ["| number | cited in |", "|---|---|"]
    for key in sorted(cited, key=sort_key):
        rows.append(f"| {key} | " + ", ".join(f"`{f}`" for f in sorted(cited[key])) + " |")
    return "\n".join(rows)


def main(argv):
    root = os.path.abspath(argv[1])
    write = "--write" in argv[2:]
    cited = {}
    for f in repository_files(root):
        if f in (MATH, SELF):
            continue
        try:
            with open(os.path.join(root, f), encoding="utf-8") as fh:
                text = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        for key in citations(text):
            cited.setdefault(key, set()).add(f)
    math_path = os.path.join(root, MATH)
    with open(math_path, encoding="utf-8") as fh:
        math_text = fh.read()
    problems = [f"{key} is cited ({', '.join(sorted(cited[key]))}) but docs/math.md does not restate it"
                for key in sorted(cited, key=sort_key) if not restated(key, math_text)]
    section = math_text.index("## Where each number is cited")
    start = math_text.index("| number | cited in |", section)
    end = start
    while end < len(math_text) and math_text.startswith("|", end):
        end = math_text.find("\n", end) + 1 if math_text.find("\n", end) >= 0 else len(math_text)
    current = math_text[start:end].rstrip("\n")
    wanted = table(cited)
    if current != wanted:
        if write:
            with open(math_path, "w", encoding="utf-8") as fh:
                fh.write(math_text[:start] + wanted + "\n" + math_text[end:])
            print("docs/math.md: citation table rewritten")
        else:
            old, new = set(current.split("\n")), set(wanted.split("\n"))
            for row in sorted(old - new):
                print("stale row:    " + row)
            for row in sorted(new - old):
                print("current row:  " + row)
            problems.append("the table under \"Where each number is cited\" in docs/math.md is out of date; "
                            "run python3 tests/docs/check_math_citations.py . --write")
    for p in problems:
        print("error: " + p)
    if problems:
        return 1
    print(f"{len(cited)} cited numbers, each restated in docs/math.md; its citation table is current")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
