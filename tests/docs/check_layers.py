#!/usr/bin/env python3
"""Fails if a folder of the product includes a folder it may not (docs/architecture.md, "Layers").

Usage: check_layers.py SOURCE_DIR [--graph]

Each folder may include its own headers and those of the folders below it:

    core <- io <- text, runs        (text and runs: side by side, knowing nothing of models)
    core <- ops <- nn <- distributed <- train <- cli
                     nn <- checks          <- cli

Read from every #include <xgrad/FOLDER/...> line of the folder's .hpp, .cpp and .inc files.
--graph prints the include graph by folder (edges with counts), as the architecture page shows.
"""
import collections
import os
import re
import sys

BELOW = {
    "core": set(),
    "io": {"core"},
    "text": {"core", "io"},
    "runs": {"core", "io"},
    "ops": {"core"},
    "nn": {"core", "io", "ops"},
    "distributed": {"core", "io", "ops", "nn"},
    "checks": {"core", "io", "ops", "nn"},
    "train": {"core", "io", "text", "runs", "ops", "nn", "distributed"},
    "cli": {"core", "io", "text", "runs", "ops", "nn", "distributed", "train", "checks"},
}
INCLUDE = re.compile(r'\s*#\s*include\s+<xgrad/([a-z_]+)/')


def main():
    root = sys.argv[1]
    edges = collections.Counter()
    bad = []
    for folder, allowed in BELOW.items():
        top = os.path.join(root, folder)
        if not os.path.isdir(top):
            bad.append(f"{folder}/: the folder is missing")
            continue
        for dirpath, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith((".hpp", ".cpp", ".inc")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or m.group(1) == folder or m.group(1) not in BELOW:
                            continue
                        edges[(folder, m.group(1))] += 1
                        if m.group(1) not in allowed:
                            bad.append(f"{os.path.relpath(path, root)}:{n}: {folder}/ includes {m.group(1)}/, "
                                       f"a folder above it or beside it")
    both = sorted((a, b) for (a, b) in edges if (b, a) in edges and a < b)
    for a, b in both:
        bad.append(f"{a}/ and {b}/ include each other")
    if "--graph" in sys.argv:
        for (a, b), c in sorted(edges.items()):
            print(f"{a} -> {b}: {c}")
    for b in bad:
        print("check_layers: " + b)
    if bad:
        return 1
    print(f"check_layers: {len(BELOW)} folders, {sum(edges.values())} includes across folders, every one downward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
