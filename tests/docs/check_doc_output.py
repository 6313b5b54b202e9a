#!/usr/bin/env python3
"""Checks that a program's output shown in a document is the output the program prints now.

Usage: check_doc_output.py DOC HEADING EXIT_STATUS -- PROGRAM [ARGS...]

Takes the first fenced block after the Markdown heading HEADING in DOC, runs PROGRAM, and
compares the block with the program's standard output line by line. Timings (a number
followed by ms, us or s as the last field of a line) differ from run to run and are compared
as <time>; runs of spaces are compared as one. The program must exit with EXIT_STATUS.
"""
import difflib
import re
import subprocess
import sys

TIME = re.compile(r"\b\d+(\.\d+)?\s*(ms|us|s)\s*$")


def normalise(text):
    lines = []
    for line in text.strip("\n").splitlines():
        line = TIME.sub("<time>", line.rstrip())
        lines.append(re.sub(r" +", " ", line))
    return lines


def block_after(doc, heading):
    text = open(doc, encoding="utf-8").read()
    at = text.find("\n" + heading + "\n")
    if at < 0:
        raise SystemExit(f"FAILED: {doc} has no heading '{heading}'")
    m = re.search(r"^```[^\n]*\n(.*?)^```", text[at:], re.MULTILINE | re.DOTALL)
    if not m:
        raise SystemExit(f"FAILED: {doc} has no fenced block after '{heading}'")
    return m.group(1)


def main(argv):
    if len(argv) < 6 or argv[4] != "--":
        print(__doc__)
        return 2
    doc, heading, status, cmd = argv[1], argv[2], int(argv[3]), argv[5:]
    shown = normalise(block_after(doc, heading))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    printed = normalise(p.stdout)
    ok = True
    if p.returncode != status:
        print(f"FAILED: {' '.join(cmd)} exited with {p.returncode}, {doc} says {status}")
        ok = False
    if shown != printed:
        print(f"FAILED: the output shown in {doc} under '{heading}' is not what the program prints:")
        sys.stdout.writelines(line + "\n" for line in difflib.unified_diff(shown, printed, "document", "program", lineterm=""))
        ok = False
    if ok:
        print(f"passed: {doc} under '{heading}' shows the program's output ({len(shown)} lines)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
