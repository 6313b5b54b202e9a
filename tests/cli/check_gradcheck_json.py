"""Runs `xgrad gradcheck --json FILE` and validates the report (stdlib only).

Usage: check_gradcheck_json.py XGRAD REPORT_PATH [extra xgrad gradcheck flags...]
Passes when xgrad exits 0, the file is valid JSON with the documented fields, at least 40
checks ran, every one passed, and the summary agrees with the rows and the printed last line.
"""
import json
import subprocess
import sys


def main() -> int:
    xgrad, path, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    run = subprocess.run([xgrad, "gradcheck", "--json", path, *extra], capture_output=True, text=True)
    sys.stdout.write(run.stdout[-2000:])
    if run.returncode != 0:
        print(f"xgrad gradcheck exited with {run.returncode}:\n{run.stderr}")
        return 1
    with open(path) as f:
        d = json.load(f)
    for key in ("tool", "dtype", "seed", "full", "tolerances", "checks", "summary"):
        assert key in d, f"missing top-level key {key!r}"
    rows = d["checks"]
    assert len(rows) >= 40, f"only {len(rows)} checks"
    fields = ("check", "kind", "dtype", "configuration", "max_abs_error", "max_rel_error", "worst_element",
              "status", "passed", "time_s", "mode", "message")
    names = set()
    for r in rows:
        for key in fields:
            assert key in r, f"check {r.get('check')!r} lacks {key!r}"
        assert r["status"] in ("passed", "failed")
        assert r["passed"] == (r["status"] == "passed")
        assert r["time_s"] >= 0
        assert r["check"] not in names, f"duplicate check {r['check']!r}"
        names.add(r["check"])
    failed = [r["check"] for r in rows if not r["passed"]]
    assert not failed, f"failed checks: {failed}"
    s = d["summary"]
    assert s["total"] == len(rows) and s["passed"] == len(rows) and s["failed"] == 0, s
    last = run.stdout.strip().splitlines()[-1]
    assert last == f"{len(rows)} passed, 0 failed", last
    print(f"JSON report OK: {len(rows)} checks, all passed ({d['dtype']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
