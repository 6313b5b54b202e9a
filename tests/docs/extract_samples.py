#!/usr/bin/env python3
"""Extracts the complete C++ programs from the documentation, so the tests build and run them.

Convention (docs/README: "Code samples"): a fenced block opened with ```cpp whose first line
that is not a comment or blank is an `#include` is a *complete program*: it must define
`int main(`, and the tests compile it against the build tree's xgrad and run it; it must exit
with status 0. Any other ```cpp block is a fragment and is not compiled. Right after the
closing fence, lines of the form

    <!-- expect: REGEX -->

(invisible when rendered) each give a Python regular expression that the program's standard
output must contain; `<!-- args: A B C -->` gives its command-line arguments.

Usage:
  extract_samples.py SOURCE_DIR OUT_DIR DOC...   writes OUT_DIR/<doc>_<n>.cpp (only when the
      text changed, so nothing rebuilds needlessly) and OUT_DIR/samples.cmake, which calls
      xgrad_doc_sample(NAME SOURCE DOC LINE LIBS <libs> ARGS <args> EXPECT <regexes>) per
      sample and sets XGRAD_DOC_SAMPLE_PROBLEMS to the convention violations found.
  extract_samples.py --check SOURCE_DIR DOC...   prints the samples found and fails on any
      violation (a test).
"""
import os
import re
import sys

MARKER = re.compile(r"^\s*<!--\s*(expect|args):\s*(.*?)\s*-->\s*$")


def blocks(path):
    """(first line number of the code, code lines, markers after the fence) for ```cpp blocks."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```cpp":
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            code = lines[start:j]
            markers = []
            k = j + 1
            while k < len(lines):
                m = MARKER.match(lines[k])
                if not m:
                    break
                markers.append((m.group(1), m.group(2), k + 1))
                k += 1
            yield start + 1, code, markers
            i = k
        else:
            m = MARKER.match(lines[i])
            if m:
                yield i + 1, None, [(m.group(1), m.group(2), i + 1)]
            i += 1


def first_code_line(code):
    in_comment = False
    for line in code:
        s = line.strip()
        if in_comment:
            if "*/" in s:
                in_comment = False
            continue
        if not s or s.startswith("//"):
            continue
        if s.startswith("/*"):
            in_comment = "*/" not in s
            continue
        return s
    return ""


def scan(source_dir, docs):
    """Samples [(name, doc, line, code, libs, args, expects)] and problems [text]."""
    samples, problems = [], []
    for doc in docs:
        path = os.path.join(source_dir, doc)
        stem = re.sub(r"[^A-Za-z0-9]+", "_", os.path.splitext(doc)[0]).strip("_").lower()
        n = 0
        for line, code, markers in blocks(path):
            if code is None:
                problems.append(f"{doc}:{markers[0][2]}: an <!-- {markers[0][0]}: --> marker must follow "
                                f"the closing fence of a complete ```cpp program")
                continue
            if not first_code_line(code).startswith("#include"):
                if markers:
                    problems.append(f"{doc}:{line}: markers after a fragment (a complete program starts with #include)")
                continue
            text = "\n".join(code)
            if not re.search(r"\bint\s+main\s*\(", text):
                problems.append(f"{doc}:{line}: a ```cpp block that starts with #include is a complete program "
                                f"and must define int main(); make it one, or drop the #include lines to "
                                f"mark it as a fragment")
                continue
            n += 1
            libs = ["xgrad::xgrad"]
            if "<xgrad/checks/" in text:
                libs.append("xgrad::checks")
            if "<xgrad/train/" in text:
                libs.append("xgrad::train")
            if "<xgrad/xtensor.hpp>" in text:
                libs.append("xtensor")  # the optional door: its users link xtensor themselves
            args = " ".join(v for k, v, _ in markers if k == "args").split()
            expects = [v for k, v, _ in markers if k == "expect"]
            for e in expects:
                try:
                    re.compile(e)
                except re.error as err:
                    problems.append(f"{doc}:{line}: <!-- expect: {e} --> is not a valid regular expression: {err}")
            samples.append((f"{stem}_{n}", doc, line, text, libs, args, expects))
    return samples, problems


def cmake_quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace(";", "\\;") + '"'


def write_if_changed(path, text):
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except OSError:
        pass
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv):
    if len(argv) >= 3 and argv[1] == "--check":
        samples, problems = scan(argv[2], argv[3:])
        for name, doc, line, _, libs, args, expects in samples:
            print(f"{doc}:{line}: complete program {name} ({', '.join(libs)}; {len(expects)} expected output pattern(s))")
        for p in problems:
            print("error: " + p)
        if not samples:
            print("error: no complete program found in " + ", ".join(argv[3:]))
        return 1 if problems or not samples else 0
    source_dir, out_dir, docs = argv[1], argv[2], argv[3:]
    samples, problems = scan(source_dir, docs)
    os.makedirs(out_dir, exist_ok=True)
    manifest = ["# Generated by tests/docs/extract_samples.py from " + " ".join(docs) + "; do not edit."]
    for name, doc, line, text, libs, args, expects in samples:
        src = os.path.join(out_dir, name + ".cpp")
        doc_path = os.path.join(source_dir, doc).replace("\\", "/")
        write_if_changed(src, f"// Extracted from {doc}:{line} (tests/docs/extract_samples.py): edit the document.\n"
                              f"#line {line} \"{doc_path}\"\n{text}\n")
        manifest.append(f"xgrad_doc_sample({name} {cmake_quote(src)} {cmake_quote(doc)} {line} LIBS {' '.join(libs)}"
                        f" ARGS {' '.join(cmake_quote(a) for a in args)}"
                        f" EXPECT {' '.join(cmake_quote(e) for e in expects)})")
    manifest.append("set(XGRAD_DOC_SAMPLE_PROBLEMS " + " ".join(cmake_quote(p) for p in problems) + ")")
    write_if_changed(os.path.join(out_dir, "samples.cmake"), "\n".join(manifest) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
