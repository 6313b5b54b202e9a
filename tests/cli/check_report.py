#!/usr/bin/env python3
"""`xgrad report` in a real browser (docs/cli.md, "xgrad report"):

    check_report.py XGRAD WORKDIR

Trains two tiny real runs (the text task with the byte tokenizer, 2 layers x 2 heads; they
differ in --lr), writes a gradient-check report with `xgrad gradcheck --json` (one check marked
failed here, so the page must put it first), then `xgrad report A B --checkpoint
A/model.safetensors --prompt ... --gradcheck ... --out report.html`, and a second report of the
runs saved by xgrad 0.2.0 (tests/fixtures/runs_v0) with their sort model's attention.

Each page is loaded in headless Chromium driven over the DevTools protocol
(--remote-debugging-pipe: JSON messages ending in NUL on fds 3 and 4). Checked: no console
error, no uncaught exception, no request but the page itself (data: URLs aside); one chart per
curve kind, each drawn by dygraphs; one heatmap canvas per layer and head, each with coloured
pixels; one table row per run and per gradient check, the failed check first; both run names
on the page; clicking a heatmap opens it large, clicking a column sorts the checks, the x-axis
switch and the log-scale box redraw the charts, all without errors. The run toggles hide and
show a run in every chart; the smoothing slider draws the debiased moving average of the
training loss (computed here from log.csv); the samples written at every evaluation
(samples.jsonl) are listed; the gradient-check table is open when a check failed and folded
into one line when all passed (a third page). Then `chromium
--screenshot` of the first page must not be blank (pixel statistics of the PNG, decoded here
with zlib); it is kept as WORKDIR/report.png. Without its plotting library (XGRAD_DYGRAPHS_JS
naming a missing file) report refuses in one line naming the package.

Exit 77 (skipped) when chromium is not installed, unless XGRAD_REQUIRE_CHROMIUM=1 (CI, which
installs it with scripts/setup.sh --test): then a failure.
"""
import base64
import csv
import json
import math
import os
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "runs_v0")
DEADLINE_S = 45.0  # the browser part of one page


def fail(msg):
    print(f"FAILED: {msg}")
    sys.exit(1)


def run(cmd, want=0, cwd=None):
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=120)
    if r.returncode != want:
        fail(f"{' '.join(cmd)}: exit {r.returncode}, want {want}\nstdout: {r.stdout}\nstderr: {r.stderr}")
    return r


def find_chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Headless Chromium over --remote-debugging-pipe (fd 3: commands in, fd 4: replies and events out)."""

    def __init__(self, chromium, profile):
        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()

        def child_fds():
            a, b = os.dup(to_r), os.dup(from_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps", "--mute-audio", "--window-size=1280,2000",
                "about:blank"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=child_fds, pass_fds=(3, 4))
        os.close(to_r)
        os.close(from_w)
        self.buf = b""
        self.next_id = 0
        self.events = []
        self.session = None

    def close(self):
        try:
            if self.proc.poll() is None:
                self._send("Browser.close", {}, session=False)
                self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - whatever went wrong, the browser must not outlive the test
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for fd in (self.to_w, self.from_r):
            try:
                os.close(fd)
            except OSError:
                pass

    def _send(self, method, params, session=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session and self.session:
            msg["sessionId"] = self.session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            n = os.write(self.to_w, data)
            data = data[n:]
        return self.next_id

    def _read(self, deadline):
        """The next message (a reply or an event); fails at the deadline."""
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                fail("the browser did not answer in time")
            ready, _, _ = select.select([self.from_r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.from_r, 1 << 20)
            if not chunk:
                fail(f"the browser closed its pipe (exit {self.proc.poll()})")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method, params=None, session=True, deadline=None):
        deadline = deadline or time.monotonic() + DEADLINE_S
        i = self._send(method, params or {}, session)
        while True:
            m = self._read(deadline)
            if m.get("id") == i:
                if "error" in m:
                    fail(f"{method}: {m['error']}")
                return m.get("result", {})
            if "method" in m:
                self.events.append(m)

    def wait_event(self, method, deadline):
        while True:
            for k, e in enumerate(self.events):
                if e["method"] == method:
                    return self.events.pop(k)
            m = self._read(deadline)
            if "method" in m:
                self.events.append(m)

    def attach(self):
        deadline = time.monotonic() + DEADLINE_S
        while True:
            pages = [t for t in self.call("Target.getTargets", session=False)["targetInfos"] if t["type"] == "page"]
            if pages:
                break
            if time.monotonic() > deadline:
                fail("the browser opened no page")
            time.sleep(0.1)
        self.session = self.call("Target.attachToTarget", {"targetId": pages[0]["targetId"], "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(domain + ".enable")

    def evaluate(self, expression):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            fail(f"evaluating {expression[:80]}...: {r['exceptionDetails']}")
        return r["result"].get("value")


def problems(events, page_url):
    """Console errors, uncaught exceptions and requests for anything but the page itself."""
    out = []
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
        elif m == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            out.append("exception: " + d.get("exception", {}).get("description", d.get("text", "")))
        elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
            out.append("log error: " + p["entry"]["text"] + " " + p["entry"].get("url", ""))
        elif m == "Network.requestWillBeSent":
            url = p["request"]["url"]
            if url != page_url and not url.startswith("data:"):
                out.append("request: " + url)
        elif m == "Network.loadingFailed":
            out.append("failed load: " + json.dumps(p))
    return out


# Everything the page must hold, measured in the page (returned as one JSON object).
DOM_PROBE = r"""
(() => {
  const painted = (c) => {
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0 && (d[i] < 235 || d[i + 1] < 235 || d[i + 2] < 235)) ++n;
    return n;
  };
  return JSON.stringify({
    ready: document.body.dataset.ready || "",
    charts: Array.from(document.querySelectorAll("#charts .chart")).map((c) => ({
      kind: c.dataset.kind,
      canvases: c.querySelectorAll(".plot canvas").length,
      painted: Array.from(c.querySelectorAll(".plot canvas")).reduce((s, x) => s + painted(x), 0),
      legend: c.querySelector(".legend").textContent,
    })),
    heatmaps: Array.from(document.querySelectorAll("canvas.heatmap")).map((c) => ({
      layer: c.dataset.layer, head: c.dataset.head, painted: painted(c), width: c.width })),
    runRows: Array.from(document.querySelectorAll("#runs-table tbody tr.run-row")).map((r) => r.dataset.run),
    checkRows: Array.from(document.querySelectorAll("#gradcheck-table tbody tr.gradcheck-row")).map((r) =>
      [r.children[0].textContent, r.children[1].textContent]),
    differing: Array.from(document.querySelectorAll("#options-table tr.differs td:first-child")).map((t) => t.textContent),
    samples: document.querySelectorAll("pre.samples").length,
    evalSamples: document.querySelectorAll("tr.eval-sample").length,
    gradcheckOpen: document.getElementById("gradcheck-details") ? document.getElementById("gradcheck-details").open : null,
    gradcheckSummary: document.querySelector("#gradcheck-details > summary") ? document.querySelector("#gradcheck-details > summary").textContent : "",
    configs: Array.from(document.querySelectorAll("pre.config")).map((p) => p.textContent),
    text: document.body.innerText,
  });
})()
"""

INTERACT = r"""
(async () => {
  const tick = () => new Promise((r) => setTimeout(r, 50));
  const out = {};
  document.querySelector("figure.heatmap-cell").click();
  await tick();
  out.modalOpen = !document.getElementById("modal").hidden;
  out.modalTitle = document.getElementById("modal-title").textContent;
  const big = document.getElementById("modal-canvas");
  out.modalWidth = big.width;
  out.smallWidth = document.querySelector("canvas.heatmap").width;
  document.getElementById("modal").click();
  await tick();
  out.modalClosed = document.getElementById("modal").hidden;
  const th = Array.from(document.querySelectorAll("#gradcheck-table th")).find((t) => t.dataset.key === "check");
  out.sortedUp = out.sortedDown = [];
  if (th) {
    th.click();
    await tick();
    out.sortedUp = Array.from(document.querySelectorAll("#gradcheck-table tbody tr")).map((r) => r.children[1].textContent);
    th.click();
    await tick();
    out.sortedDown = Array.from(document.querySelectorAll("#gradcheck-table tbody tr")).map((r) => r.children[1].textContent);
  }
  for (const axis of ["tokens", "bytes", "wall", "step"]) {
    const s = document.getElementById("x-axis");
    s.value = axis;
    s.dispatchEvent(new Event("change"));
    await tick();
    out["charts_" + axis] = document.querySelectorAll("#charts .plot canvas").length;
    const last = document.querySelector('.chart[data-kind="loss"]').dataset.last;
    out["lastX_" + axis] = last ? JSON.parse(last)[0] : null;
    out["xNote_" + axis] = document.getElementById("x-note").textContent;
  }
  const box = document.getElementById("log-scale");
  box.checked = !box.checked;
  box.dispatchEvent(new Event("change"));
  await tick();
  out.chartsLinear = document.querySelectorAll("#charts .plot canvas").length;
  const series = () => Array.from(document.querySelectorAll("#charts .chart")).map((c) => c.dataset.series);
  const lossLast = () => JSON.parse(document.querySelector('.chart[data-kind="loss"]').dataset.last);
  out.seriesAll = series();
  out.lossLastRaw = lossLast();
  const toggles = Array.from(document.querySelectorAll("input.run-toggle"));
  out.toggles = toggles.map((t) => t.dataset.run);
  if (toggles.length > 1) {
    toggles[1].checked = false;
    toggles[1].dispatchEvent(new Event("change"));
    await tick();
    out.seriesHidden = series();
    out.canvasesHidden = document.querySelectorAll("#charts .plot canvas").length;
    toggles[1].checked = true;
    toggles[1].dispatchEvent(new Event("change"));
    await tick();
    out.seriesShownAgain = series();
  }
  const slider = document.getElementById("smoothing");
  slider.value = "0.9";
  slider.dispatchEvent(new Event("input"));
  await tick();
  out.lossLastSmoothed = lossLast();
  out.smoothingLabel = document.getElementById("smoothing-value").textContent;
  out.valLastSmoothed = JSON.parse(document.querySelector('.chart[data-kind="val_loss"]').dataset.last || "null");
  slider.value = "0";
  slider.dispatchEvent(new Event("input"));
  await tick();
  out.valLastRaw = JSON.parse(document.querySelector('.chart[data-kind="val_loss"]').dataset.last || "null");
  return JSON.stringify(out);
})()
"""


def smoothed_last(values, w):
    """The debiased exponential moving average of `values` at its last value (the page's smoothing)."""
    avg, n = 0.0, 0
    for y in values:
        avg = w * avg + (1 - w) * y
        n += 1
    return avg / (1 - w ** n)


def check_toggles_and_smoothing(name, act, want):
    runs = want["runs"]
    if act["toggles"] != runs:
        fail(f"{name}: run toggles {act['toggles']}, want {runs}")
    if act["seriesAll"][0] != "|".join(runs):
        fail(f"{name}: the loss chart draws {act['seriesAll'][0]!r}, want every run")
    if len(runs) > 1:
        if any(runs[1] in s.split("|") for s in act["seriesHidden"]) or act["canvasesHidden"] < len(want["kinds"]):
            fail(f"{name}: hiding {runs[1]} left it drawn: {act['seriesHidden']}")
        if act["seriesShownAgain"] != act["seriesAll"]:
            fail(f"{name}: showing {runs[1]} again gave {act['seriesShownAgain']}, want {act['seriesAll']}")
    if act["smoothingLabel"] != "0.9":
        fail(f"{name}: the smoothing label says {act['smoothingLabel']!r}")
    # The last row of the loss chart: [x, run values...]; each run's smoothed value from its log.csv.
    for k, run_dir in enumerate(want.get("logs", [])):
        with open(os.path.join(run_dir, "log.csv")) as f:
            rows = list(csv.DictReader(f))
        losses = [float(r["loss"]) for r in rows]
        raw, smooth = act["lossLastRaw"][1 + k], act["lossLastSmoothed"][1 + k]
        expect = smoothed_last(losses, 0.9)
        if abs(raw - losses[-1]) > 1e-12 * abs(losses[-1]) or abs(smooth - expect) > 1e-9 * abs(expect):
            fail(f"{name}: run {runs[k]}: loss {raw!r} -> smoothed {smooth!r}, log.csv gives {losses[-1]!r} -> {expect!r}")
        if smooth == raw:
            fail(f"{name}: run {runs[k]}: smoothing 0.9 left the last loss unchanged ({raw!r})")
    if act["valLastSmoothed"] != act["valLastRaw"]:
        fail(f"{name}: smoothing changed the validation loss (points): {act['valLastSmoothed']} vs {act['valLastRaw']}")


def check_bytes_axis(name, act, want):
    """The bytes-seen axis: tokens seen times the runs' bytes per token, which log.csv gives as
    val_loss / (val_bpb ln 2) (the first row with both, as xgrad compare reads it)."""
    logs = want.get("logs", [])
    if not logs:  # runs without val_bpb: none drawn, and the note says why
        if act["xNote_bytes"] and "bytes seen are unknown" not in act["xNote_bytes"]:
            fail(f"{name}: the bytes axis note says {act['xNote_bytes']!r}")
        return
    with open(os.path.join(logs[0], "log.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r.get("val_bpb") and r.get("val_loss")]
    if not rows:
        fail(f"{name}: {logs[0]}/log.csv has no val_bpb row to test the bytes axis with")
    bpt = float(rows[0]["val_loss"]) / (float(rows[0]["val_bpb"]) * math.log(2.0))
    tokens, got = act["lastX_tokens"], act["lastX_bytes"]
    if act["charts_bytes"] < len(want["kinds"]) or act["xNote_bytes"]:
        fail(f"{name}: the bytes axis drew {act['charts_bytes']} charts, note {act['xNote_bytes']!r}")
    if tokens is None or got is None or abs(got - tokens * bpt) > 1e-9 * abs(tokens * bpt):
        fail(f"{name}: the loss chart's last x on the bytes axis is {got!r}; tokens seen {tokens!r} x bytes per token "
             f"{bpt!r} from log.csv gives {tokens * bpt if tokens is not None else None!r}")


def check_page(browser, path, want):
    """Loads `path` and checks it against `want` (kinds, layers, heads, runs, checks, failed_first)."""
    url = "file://" + os.path.abspath(path)
    browser.events.clear()
    deadline = time.monotonic() + DEADLINE_S
    browser.call("Page.navigate", {"url": url}, deadline=deadline)
    browser.wait_event("Page.loadEventFired", deadline)
    dom = json.loads(browser.evaluate(DOM_PROBE))
    name = os.path.basename(path)
    if dom["ready"] != "1":
        fail(f"{name}: the page's script did not finish (body[data-ready] is {dom['ready']!r})")
    kinds = [c["kind"] for c in dom["charts"]]
    if kinds != want["kinds"]:
        fail(f"{name}: charts {kinds}, want one per curve kind {want['kinds']}")
    for c in dom["charts"]:
        if c["canvases"] == 0 or c["painted"] < 200:
            fail(f"{name}: chart {c['kind']} was not drawn ({c['canvases']} canvases, {c['painted']} painted pixels)")
        for label in want["runs"] if c["kind"] == "loss" else []:
            if label not in c["legend"]:
                fail(f"{name}: chart {c['kind']}'s legend {c['legend']!r} does not name run {label}")
    cells = sorted((int(h["layer"]), int(h["head"])) for h in dom["heatmaps"])
    want_cells = [(layer, head) for layer in range(want["layers"]) for head in range(want["heads"])]
    if cells != want_cells:
        fail(f"{name}: heatmaps of (layer, head) {cells}, want one for each of {want_cells}")
    for h in dom["heatmaps"]:
        if h["painted"] < 100:
            fail(f"{name}: heatmap layer {h['layer']} head {h['head']} is blank ({h['painted']} painted pixels)")
    if dom["runRows"] != want["runs"]:
        fail(f"{name}: run rows {dom['runRows']}, want {want['runs']}")
    for label in want["runs"]:
        if label not in dom["text"]:
            fail(f"{name}: run name {label} is not on the page")
    if [c[1] for c in dom["checkRows"]] != want["checks"]:
        fail(f"{name}: gradient-check rows {dom['checkRows'][:5]}..., want {want['checks'][:5]}... (failures first)")
    if want["checks"] and dom["checkRows"][0][0] != ("failed" if want["failed_first"] else "passed"):
        fail(f"{name}: the first gradient-check row is {dom['checkRows'][0]}")
    if dom["differing"] != want["differing"]:
        fail(f"{name}: highlighted options {dom['differing']}, want {want['differing']}")
    if dom["samples"] != want["samples"]:
        fail(f"{name}: {dom['samples']} sample blocks, want {want['samples']}")
    if dom["evalSamples"] != want.get("eval_samples", 0):
        fail(f"{name}: {dom['evalSamples']} samples at evaluation, want {want.get('eval_samples', 0)}")
    if dom["gradcheckOpen"] != want.get("gradcheck_open"):
        fail(f"{name}: gradient-check table open {dom['gradcheckOpen']}, want {want.get('gradcheck_open')}")
    if want.get("gradcheck_open") is False and not dom["gradcheckSummary"].startswith("all "):
        fail(f"{name}: the folded gradient-check line says {dom['gradcheckSummary']!r}")
    for cfg in dom["configs"]:
        json.loads(cfg)  # the configuration is JSON
    if len(dom["configs"]) != len(want["runs"]):
        fail(f"{name}: {len(dom['configs'])} configurations, want one per run")
    if want["layers"]:
        act = json.loads(browser.evaluate(INTERACT))
        if not (act["modalOpen"] and act["modalClosed"] and act["modalWidth"] >= 2 * act["smallWidth"]):
            fail(f"{name}: clicking a heatmap did not open it large and close it again: {act}")
        names = want["checks"]
        if act["sortedUp"] != sorted(names) or act["sortedDown"] != sorted(names, reverse=True):
            fail(f"{name}: sorting by name gave {act['sortedUp'][:4]}... and {act['sortedDown'][:4]}...")
        for key in ("charts_tokens", "charts_wall", "charts_step", "chartsLinear"):
            if act[key] < len(want["kinds"]):
                fail(f"{name}: after switching ({key}) only {act[key]} chart canvases")
        check_toggles_and_smoothing(name, act, want)
        check_bytes_axis(name, act, want)
    # Give late errors (timers, resources) a moment to arrive.
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        ready, _, _ = select.select([browser.from_r], [], [], max(0.0, end - time.monotonic()))
        if ready:
            m = browser._read(time.monotonic() + 5)
            if "method" in m:
                browser.events.append(m)
    bad = problems(browser.events, url)
    if bad:
        fail(f"{name}: " + "; ".join(bad[:5]))
    requests = [e for e in browser.events if e["method"] == "Network.requestWillBeSent"]
    if not any(e["params"]["request"]["url"] == url for e in requests):
        fail(f"{name}: the request log saw no request for the page itself: it cannot tell what was requested")


def differing_v0():
    """The options that differ between the 0.2.0 sort and charlm runs, from the opt.* metadata of
    their train_state.safetensors headers (those runs have no config.json)."""
    opts = []
    for run in ("sort", "charlm"):
        with open(os.path.join(FIXTURES, run, "train_state.safetensors"), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            meta = json.loads(f.read(n))["__metadata__"]
        opts.append({k[4:]: v for k, v in meta.items() if k.startswith("opt.") and len(k) > 4})

    def same(a, b):
        try:
            return float(a) == float(b)
        except ValueError:
            return a == b

    keys = sorted(set(opts[0]) | set(opts[1]))
    return [k for k in keys if k not in ("out", "resume") and
            (k not in opts[0] or k not in opts[1] or not same(opts[0][k], opts[1][k]))]


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB or RGBA non-interlaced PNG."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path} is not a PNG")
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = hdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        fail(f"{path}: PNG depth {depth}, colour type {ctype}, interlace {interlace}: not decoded here")
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(h):
        ft = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ft == 1:
                line[i] = (line[i] + a) & 255
            elif ft == 2:
                line[i] = (line[i] + b) & 255
            elif ft == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def check_screenshot(path):
    w, h, bpp, rows = png_pixels(path)
    if w < 800 or h < 600:
        fail(f"{path}: {w} x {h}, too small")
    colours, inked, blue, total = set(), 0, 0, 0
    for y in range(0, h, 2):
        row = rows[y]
        for x in range(0, w, 2):
            r, g, b = row[x * bpp], row[x * bpp + 1], row[x * bpp + 2]
            total += 1
            colours.add((r >> 3, g >> 3, b >> 3))
            if r < 200 or g < 200 or b < 200:
                inked += 1
            if b > r + 60 and b > 100:
                blue += 1
    if inked < 0.03 * total or len(colours) < 40 or blue < 0.005 * total:
        fail(f"{path} looks blank: {inked / total:.1%} inked pixels, {len(colours)} colours, {blue / total:.2%} blue")
    print(f"screenshot {w} x {h}: {inked / total:.1%} inked, {len(colours)} colours, {blue / total:.2%} blue")


def main():
    xgrad, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    chromium = find_chromium()
    if chromium is None:
        print("SKIPPED: chromium is not installed (apt-get install chromium, or scripts/setup.sh --test)")
        if os.environ.get("XGRAD_REQUIRE_CHROMIUM") == "1":
            fail("XGRAD_REQUIRE_CHROMIUM=1 but chromium is missing")
        sys.exit(77)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # A corpus of several documents (files; the text task holds some out for validation).
    os.makedirs(os.path.join(work, "corpus"))
    for i in range(8):
        with open(os.path.join(work, "corpus", f"doc{i}.txt"), "w") as f:
            f.write(f"Document {i}: the quick brown fox jumps over the lazy dog {i * 7} times,\n"
                    "and the dog does not mind at all.\n" * (1 + i % 3))
    small = ["--task", "text", "--text", "corpus", "--context", "16", "--d-model", "16", "--heads", "2",
             "--layers", "2", "--batch", "8", "--steps", "30", "--eval-every", "10", "--threads", "1",
             "--no-progress", "--no-plot"]
    run([xgrad, "train"] + small + ["--out", "run_a"], cwd=work)
    run([xgrad, "train"] + small + ["--lr", "0.002", "--out", "run_b"], cwd=work)
    for d in ("run_a", "run_b"):
        if not os.path.exists(os.path.join(work, d, "result.txt")):
            fail(f"{d}: a finished run has no result.txt")

    # A gradient-check report; the last check is marked failed here (the page puts failures first).
    gc = os.path.join(work, "gradcheck.json")
    run([xgrad, "gradcheck", "--filter", "ops/*", "--json", gc])
    with open(gc) as f:
        report = json.load(f)
    report["checks"][-1]["status"], report["checks"][-1]["passed"] = "failed", False
    with open(gc, "w") as f:
        json.dump(report, f)
    names = [c["check"] for c in report["checks"]]
    want_checks = [names[-1]] + names[:-1]
    with open(os.path.join(work, "gradcheck_ok.json"), "w") as f:  # the same report, every check passed
        report["checks"][-1]["status"], report["checks"][-1]["passed"] = "passed", True
        json.dump(report, f)
    for d in ("run_a", "run_b"):  # one sample at each of the evaluations at steps 10, 20, 30
        with open(os.path.join(work, d, "samples.jsonl")) as f:
            steps = [json.loads(line)["step"] for line in f]
        if steps != [10, 20, 30]:
            fail(f"{d}/samples.jsonl: samples at steps {steps}, want 10, 20, 30")

    # Without the plotting library: one line naming the package, exit 2, nothing written.
    env = dict(os.environ, XGRAD_DYGRAPHS_JS=os.path.join(work, "no", "dygraph.min.js"))
    r = subprocess.run([xgrad, "report", "run_a", "--out", "nolib.html"], cwd=work, env=env, capture_output=True,
                       text=True, timeout=60)
    lines = r.stderr.splitlines()
    if r.returncode != 2 or len(lines) != 1 or "libjs-dygraphs" not in lines[0] or \
            os.path.exists(os.path.join(work, "nolib.html")):
        fail(f"report without its library: exit {r.returncode}, stderr {r.stderr!r}")

    page = os.path.join(work, "report.html")
    run([xgrad, "report", "run_a", "run_b", "--checkpoint", "run_a/model.safetensors", "--prompt",
         "the quick fox", "--gradcheck", "gradcheck.json", "--out", "report.html"], cwd=work)
    page_ok = os.path.join(work, "report_ok.html")
    run([xgrad, "report", "run_a", "--checkpoint", "run_a/model.safetensors", "--prompt", "the quick fox",
         "--gradcheck", "gradcheck_ok.json", "--out", "report_ok.html"], cwd=work)
    page_v0 = os.path.join(work, "report_v0.html")
    run([xgrad, "report", os.path.join(FIXTURES, "sort"), os.path.join(FIXTURES, "charlm"), "--checkpoint",
         os.path.join(FIXTURES, "sort", "model.safetensors"), "--prompt", "3102|", "--out", page_v0])
    with open(page, encoding="utf-8") as f:
        html = f.read()
    if "<script src" in html or "stylesheet" in html:
        fail("report.html links a script or a style sheet instead of holding it")

    profile = tempfile.mkdtemp(prefix="xgrad-report-chromium-")
    browser = Browser(chromium, profile)
    try:
        browser.attach()
        kinds = ["loss", "val_loss", "val_bpb", "lr", "grad_norm", "tokens_per_s"]
        check_page(browser, page, {"kinds": kinds, "layers": 2, "heads": 2, "runs": ["run_a", "run_b"],
                                   "checks": want_checks, "failed_first": True, "differing": ["lr"],
                                   "samples": 2, "eval_samples": 6, "gradcheck_open": True,
                                   "logs": [os.path.join(work, "run_a"), os.path.join(work, "run_b")]})
        # Every check passed: the table folds into one line.
        check_page(browser, page_ok, {"kinds": kinds, "layers": 2, "heads": 2, "runs": ["run_a"],
                                      "checks": names, "failed_first": False, "differing": [],
                                      "samples": 1, "eval_samples": 3, "gradcheck_open": False,
                                      "logs": [os.path.join(work, "run_a")]})
        # 0.2.0 runs: no config.json (options from the state's metadata), no result.txt; the sort
        # model has one layer of 2 heads (window 4).
        check_page(browser, page_v0, {"kinds": ["loss", "val_loss", "lr", "grad_norm", "tokens_per_s"],
                                      "layers": 1, "heads": 2, "runs": ["sort", "charlm"], "checks": [],
                                      "failed_first": False,
                                      "differing": differing_v0(), "samples": 0})
    finally:
        browser.close()
        shutil.rmtree(profile, ignore_errors=True)

    shot = os.path.join(work, "report.png")
    profile = tempfile.mkdtemp(prefix="xgrad-report-chromium-")
    try:
        r = subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                            "--no-first-run", "--disable-extensions", "--disable-background-networking",
                            "--hide-scrollbars", "--window-size=1280,1800", f"--screenshot={shot}",
                            "file://" + page], capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if r.returncode != 0 or not os.path.exists(shot):
        fail(f"chromium --screenshot: exit {r.returncode}: {r.stderr[-500:]}")
    check_screenshot(shot)
    print("report pages check out")


if __name__ == "__main__":
    main()
