"""Runs `xgrad gradcheck --json FILE` and validates the report (stdlib only).

Usage: check_gradcheck_json.py XGRAD REPORT_PATH [extra xgrad gradcheck flags...]
Passes when xgrad exits 0, the file is valid JSON with the documented fields, at least 40
checks ran, none failed, and the summary agrees with the rows and the printed last line.
With `--order 2` among the flags: the report says order 2, a skipped check has mode "skipped"
and its reason in the message, and no gradient check is skipped: neither an op check ("ops/...",
every op has a second-order form) nor a module, layer or model check (kind "gradient", leaves
checked in place by gradgradcheck_leaves and jvpcheck_leaves). At order 1 nothing may be skipped.
"""
import json
import os
import subprocess
import sys


def main() -> int:
    xgrad, path, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    order = int(extra[extra.index("--order") + 1]) if "--order" in extra else 1
    # A report from an earlier run goes first: an existing --json FILE is refused without
    # --overwrite (docs/cli.md), and a stale file must not pass for this run's report.
    if os.path.exists(path):
        os.remove(path)
    run = subprocess.run([xgrad, "gradcheck", "--json", path, *extra], capture_output=True, text=True)
    sys.stdout.write(run.stdout[-2000:])
    if run.returncode != 0:
        print(f"xgrad gradcheck exited with {run.returncode}:\n{run.stderr}")
        return 1
    with open(path) as f:
        d = json.load(f)
    for key in ("tool", "dtype", "order", "seed", "full", "tolerances", "checks", "summary"):
        assert key in d, f"missing top-level key {key!r}"
    assert d["order"] == order, f"order {d['order']!r}, ran with {order}"
    rows = d["checks"]
    assert len(rows) >= 40, f"only {len(rows)} checks"
    fields = ("check", "kind", "dtype", "configuration", "max_abs_error", "max_rel_error", "worst_element",
              "status", "passed", "time_s", "mode", "message")
    names = set()
    for r in rows:
        for key in fields:
            assert key in r, f"check {r.get('check')!r} lacks {key!r}"
        assert r["status"] in ("passed", "failed", "skipped"), r["status"]
        assert r["passed"] == (r["status"] == "passed")
        if r["status"] == "skipped":
            assert order == 2, f"{r['check']!r} skipped at order {order}"
            assert r["mode"] == "skipped" and "no second-order form" in r["message"], r
            assert not r["check"].startswith("ops/"), f"op check {r['check']!r} skipped at order 2"
            assert r["kind"] != "gradient", f"gradient check {r['check']!r} skipped at order 2: {r['message']}"
        assert r["time_s"] >= 0
        assert r["check"] not in names, f"duplicate check {r['check']!r}"
        names.add(r["check"])
    failed = [r["check"] for r in rows if r["status"] == "failed"]
    assert not failed, f"failed checks: {failed}"
    passed = sum(r["status"] == "passed" for r in rows)
    skipped = sum(r["status"] == "skipped" for r in rows)
    assert passed > 0, "no check passed"
    s = d["summary"]
    assert s["order"] == order, s
    assert s["total"] == len(rows) and s["passed"] == passed and s["failed"] == 0 and s["skipped"] == skipped, s
    last = run.stdout.strip().splitlines()[-1]
    expect = f"{passed} passed, 0 failed" + (f", {skipped} skipped" if skipped else "")
    assert last == expect, (last, expect)
    print(f"JSON report OK: {len(rows)} checks, {passed} passed, {skipped} skipped ({d['dtype']}, order {order})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
