#!/usr/bin/env python3
"""Doxygen input filter for the Markdown pages (docs/Doxyfile.in, FILTER_PATTERNS).

The pages are written for GitHub's Markdown; Doxygen reads them with three differences,
which this filter bridges without changing the files:

- math: GitHub's `$...$` and `$$...$$` become Doxygen formulas `\\f$...\\f$` and `\\f[...\\f]`
  (rendered by MathJax), so LaTeX commands are not read as Doxygen commands;
- section links: GitHub gives every heading an anchor (its "slug"); Doxygen only knows labels
  written as `{#label}`, unique over all pages, so every heading below the page title gets
  the label PAGE-SLUG (PAGE: the file name without .md) and links `[text](#slug)` and
  `[text](page.md#slug)` are rewritten to match;
- nothing else: code spans, fenced code blocks and comment lines (`<!-- expect: ... -->`,
  whose regular expressions may end in `$`) pass through untouched.

Usage (by Doxygen): doxygen_md_filter.py FILE, writes the filtered text to stdout.
"""
import re
import sys


def github_slug(title, seen):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    slug = title.strip().lower()
    slug = re.sub(r"[^\w\- ]", "", slug)  # keeps letters, digits, '_', '-', ' '
    slug = slug.replace(" ", "-")
    base, n = slug, seen.get(slug, 0)
    if n:
        slug = f"{base}-{n}"
    seen[base] = n + 1
    return slug


def convert_math(line, open_math=None):
    """`$...$` to `\\f$...\\f$` and `$$...$$` to `\\f[...\\f]` outside code spans.

    `open_math` is the delimiter of a formula that began on an earlier line ("$" or "$$"),
    or None. Returns the converted text and the delimiter still open at its end (or None).
    """
    out, i, n = [], 0, len(line)
    if open_math:
        j = line.find(open_math)
        if j < 0:
            return line, open_math
        out.append(line[:j] + ("\\f]" if open_math == "$$" else "\\f$"))
        i = j + len(open_math)
    while i < n:
        c = line[i]
        if c == "`":  # a code span: copy it whole
            j = line.find("`", i + 1)
            if j < 0:
                out.append(line[i:])
                break
            out.append(line[i:j + 1])
            i = j + 1
        elif c == "$":
            delim = "$$" if line.startswith("$$", i) else "$"
            j = line.find(delim, i + len(delim))
            start, end = ("\\f[", "\\f]") if delim == "$$" else ("\\f$", "\\f$")
            if j < 0:  # the formula continues on the next lines
                out.append(start + line[i + len(delim):])
                return "".join(out), delim
            out.append(start + line[i + len(delim):j] + end)
            i = j + len(delim)
        else:
            out.append(c)
            i += 1
    return "".join(out), None


def page_of(path):
    """The label prefix of a page: its file name without .md."""
    return re.sub(r"\.md$", "", path.replace("\\", "/").split("/")[-1])


def convert_links(line, page):
    """`](#slug)` and `](other.md#slug)` to the labels this filter gives headings."""
    line = re.sub(r"\]\(#([\w-]+)\)", lambda m: f"](#{page}-{m.group(1)})", line)
    return re.sub(r"\]\(([\w./-]*?)([\w-]+)\.md#([\w-]+)\)", lambda m: f"](#{m.group(2)}-{m.group(3)})", line)


def main():
    path = sys.argv[1]
    page = page_of(path)
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, seen = [], {}
    fence = None
    open_math = None
    first_heading = True
    for line in lines:
        stripped = line.lstrip()
        if fence:
            out.append(line)
            if stripped.startswith(fence):
                fence = None
            continue
        if open_math:
            text, open_math = convert_math(line, open_math)
            out.append(text)
            continue
        if re.match(r"^<!--.*-->\s*$", stripped):  # a comment line (<!-- expect: REGEX$ -->): no math in it
            out.append(line)
            continue
        m = re.match(r"^(```|~~~)", stripped)
        if m:
            fence = m.group(1)
            out.append(line)
            continue
        h = re.match(r"^(#{1,6})\s+(.*?)\s*$", line)
        if h:
            text, _ = convert_math(h.group(2))
            if first_heading:  # the page title keeps the page's own name
                first_heading = False
                out.append(f"{h.group(1)} {text}")
            else:
                out.append(f"{h.group(1)} {text} {{#{page}-{github_slug(h.group(2), seen)}}}")
            continue
        text, open_math = convert_math(convert_links(line, page))
        out.append(text)
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()
