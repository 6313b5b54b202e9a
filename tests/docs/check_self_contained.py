#!/usr/bin/env python3
"""Fails if any file of the repository points outside it.

Usage: check_self_contained.py SOURCE_DIR

The repository must be readable and buildable on its own: no path into a shared folder
next to it, into the machine it was written on, or to the design documents it was
specified from (their content is restated in docs/math.md). Every text file of the
repository is searched (git's file list, tracked or not but not ignored; without git, every
file under SOURCE_DIR but .git and build trees).
"""
import os
import re
import subprocess
import sys

# Written so that this file does not match itself.
FORBIDDEN = [
    (re.compile(re.escape("../" + "shared")), "a path into a shared folder outside the repository"),
    (re.compile(re.escape("/" + "work/")), "a path on the machine the repository was written on"),
    (re.compile(re.escape("SPEC" + ".md"), re.IGNORECASE), "the design digest (restated in docs/math.md)"),
    (re.compile(re.escape("chapter" + "05"), re.IGNORECASE), "the source chapter (restated in docs/math.md)"),
]


def candidate_files(root):
    """The repository's files: git's list (tracked and untracked, not ignored) when it is a git
    checkout, else every file but .git and build trees (folders holding a CMakeCache.txt)."""
    try:
        p = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
        return [os.path.join(root, f) for f in p.stdout.decode("utf-8").split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames
                       if d != ".git" and not os.path.exists(os.path.join(dirpath, d, "CMakeCache.txt"))]
        files += [os.path.join(dirpath, name) for name in filenames if name != ".git"]
    return files


def main(argv):
    root = os.path.abspath(argv[1])
    hits, files = [], 0
    for path in candidate_files(root):
        if not os.path.isfile(path):
            continue  # listed by git but deleted in the work tree
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
