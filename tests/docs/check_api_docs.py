#!/usr/bin/env python3
"""Builds the API reference and fails on any Doxygen warning or undocumented public symbol.

Usage: check_api_docs.py CMAKE BUILD_DIR XML_DIR

1. `CMAKE --build BUILD_DIR --target docs` runs Doxygen with docs/Doxyfile.in, whose
   WARN_AS_ERROR makes every warning (an undocumented class, function or member, a wrong
   \\param name, broken markup) fail the build; any "warning:"/"error:" line fails here too.
2. Doxygen does not warn about undocumented enumerators, so its XML output is read as well:
   every public or protected class, namespace, function, variable, typedef, enum and
   enumerator of the headers must have a description.
"""
import glob
import os
import subprocess
import sys
import xml.etree.ElementTree as ET


def described(el):
    text = ""
    for tag in ("briefdescription", "detaileddescription"):
        d = el.find(tag)
        if d is not None:
            text += "".join(d.itertext()).strip()
    return bool(text)


def main(argv):
    cmake, build_dir, xml_dir = argv[1:4]
    p = subprocess.run([cmake, "--build", build_dir, "--target", "docs"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(p.stdout)
    problems = [line for line in p.stdout.splitlines() if "warning:" in line or ": error:" in line]
    if p.returncode != 0 or problems:
        print(f"FAILED: building the API reference gave {len(problems)} warning(s) (exit status {p.returncode})")
        return 1
    files = glob.glob(os.path.join(xml_dir, "*.xml"))
    if not files:
        print(f"FAILED: no Doxygen XML in {xml_dir}")
        return 1
    missing, members = [], set()
    for path in files:
        if os.path.basename(path) in ("index.xml", "Doxyfile.xml"):
            continue
        root = ET.parse(path).getroot()
        for cd in root.iter("compounddef"):
            kind, name = cd.get("kind"), cd.findtext("compoundname")
            if kind in ("file", "dir", "page", "example"):
                if kind == "file" and name.endswith(".hpp") and not described(cd):
                    missing.append(f"file {name}")
                if kind != "file":
                    continue
            elif not described(cd):
                missing.append(f"{kind} {name}")
            for m in cd.iter("memberdef"):
                if m.get("prot") == "private" or m.get("kind") == "friend":
                    continue
                members.add(m.get("id"))
                loc = m.find("location")
                where = f"{loc.get('file')}:{loc.get('line')}" if loc is not None else name
                if not described(m):
                    missing.append(f"{where}: {m.get('kind')} {name}::{m.findtext('name')}")
                for ev in m.iter("enumvalue"):
                    if not described(ev):
                        missing.append(f"{where}: enumerator {name}::{m.findtext('name')}::{ev.findtext('name')}")
    for x in sorted(set(missing)):
        print("undocumented: " + x)
    if missing:
        print(f"FAILED: {len(set(missing))} undocumented public symbol(s)")
        return 1
    print(f"API reference built without warnings; {len(members)} documented members checked")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
