#!/usr/bin/env python3
"""Fails if any file of the repository points outside it.

Usage: check_self_contained.py SOURCE_DIR

The repository must be readable and buildable on its own: no path into a shared folder
next to it, into the machine it was written on, or to the design documents it was
specified from (their content is restated in docs/math.md). Every text file under
SOURCE_DIR is searched, except .git and build trees (folders holding a CMakeCache.txt).
"""
import os
import re
import sys

# Written so that this file does not match itself.
FORBIDDEN = [
    (re.compile(re.escape("../" + "shared")), "a path into a shared folder outside the repository"),
    (re.compile(re.escape("/" + "work/")), "a path on the machine the repository was written on"),
    (re.compile(re.escape("SPEC" + ".md"), re.IGNORECASE), "the design digest (restated in docs/math.md)"),
    (re.compile(re.escape("chapter" + "05"), re.IGNORECASE), "the source chapter (restated in docs/math.md)"),
]


def main(argv):
    root = os.path.abspath(argv[1])
    hits, files = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames
                       if d != ".git" and not os.path.exists(os.path.join(dirpath, d, "CMakeCache.txt"))]
        for name in filenames:
            if name == ".git":  # a worktree's pointer to its repository
                continue
            path = os.path.join(dirpath, name)
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (UnicodeDecodeError, OSError):
                continue  # binary or unreadable: not documentation or source
            files += 1
            for lineno, line in enumerate(text.split("\n"), 1):
                for pattern, what in FORBIDDEN:
                    if pattern.search(line):
                        hits.append(f"{os.path.relpath(path, root)}:{lineno}: {what}: {line.strip()[:120]}")
    for h in hits:
        print(h)
    if hits:
        print(f"FAILED: {len(hits)} reference(s) to something outside the repository")
        return 1
    print(f"{files} text files checked: nothing points outside the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
