#!/usr/bin/python3
"""End-to-end test: the --html report pages render in a browser.

Compiles the committed default model (models/tiny/gpt-tiny.onnx) twice with `sp-compile --html`,
on one device and pipelined (t = 2 + SP, p = 2, 4 microbatches), trains the pipelined plan for a
few steps with `sp-run --html` (validation tokens from `sp-tokenize --split 0.9`), and opens each
page in headless Chromium (Debian's `chromium`, which tools/dev.sh installs):

  static      the file reaches nothing outside itself: no http:// or https://, no src= and no
              href= but to a #fragment
  dom         `--dump-dom` (the DOM after the page's scripts ran) holds each expected section
              and each expected chart's <svg>, and no section or chart that does not belong
              (a page without a pipeline has no Gantt chart)
  selfcheck   the page's inline self-check (every <svg> has a non-empty bounding box; no script
              error) wrote `ok N charts, M bars` into #selfcheck, N the expected charts
  screenshot  `--screenshot` at 1280x2400 is a PNG of that size that is not blank: its
              scanlines (decompressed with zlib) take many distinct values, where a blank
              page's screenshot, taken the same way, has a handful

The screenshots stay in the workdir (the test's artifacts); their paths are printed.
With --readme-screenshots DIR it also writes DIR/report-compile.png (the pipelined compile page)
and DIR/report-run.png at 1280x1600, the pictures of the README and docs/inspecting.md.

Prints one PASS/FAIL line per check and a final `N passed, M failed`; exits 1 if any check failed
(or Chromium is missing: run tools/dev.sh test, which installs it), 2 if a tool is missing from
--sp-bin.

    /usr/bin/python3 tests/e2e/check_html_report.py --sp-bin build/bin --workdir /tmp/e2e-html
"""

import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(REPO, "models", "tiny", "gpt-tiny.onnx")
TEXT = os.path.join(REPO, "models", "data", "python-reference.txt")

# Each page: what the command writes, the sections it must have (in order) and its charts.
BASE = ["options", "model", "memory", "collectives"]
PAGES = {
    "compile-plain": (BASE + ["flops"], ["chart-memory"]),
    "compile-pipelined": (BASE + ["pipeline", "flops"], ["chart-memory", "chart-schedule"]),
    "run": (["training", "options", "model", "memory", "measured-memory", "collectives", "pipeline",
             "flops"], ["chart-loss", "chart-schedule"]),
}
ALL_CHARTS = {"chart-memory", "chart-schedule", "chart-loss"}


class Results:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def report(self, name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok


def run(cmd, timeout=300):
    """Runs cmd in the repository (so that the pages show paths relative to it)."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def rel(path):
    """path relative to the repository when it is inside it."""
    r = os.path.relpath(path, REPO)
    return path if r.startswith("..") else r


def last_line(proc):
    text = (proc.stderr or "").strip() or (proc.stdout or "").strip() or "(no output)"
    return text.splitlines()[-1]


class Chromium:
    """Headless Chromium with a profile of its own per call (tests may run side by side)."""

    def __init__(self, binary, workdir):
        self.binary = binary
        self.workdir = workdir
        self.calls = 0

    def _run(self, args, timeout=90, attempts=2):
        """A call takes a second or two. Headless Chromium itself sometimes never exits (seen
        once in CI on a loaded 2-core VM: a screenshot that took 5 s when rerun): such a call
        is killed after `timeout` seconds and made again, in a fresh profile, once."""
        for attempt in range(1, attempts + 1):
            self.calls += 1
            profile = os.path.join(self.workdir, f"chromium-profile-{self.calls}")
            shutil.rmtree(profile, ignore_errors=True)
            cmd = [self.binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                   "--no-first-run", "--disable-extensions", "--disable-background-networking",
                   f"--user-data-dir={profile}"] + args
            try:
                return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                if attempt == attempts:
                    raise
                print(f"note: chromium did not exit within {timeout} s; running it again", flush=True)
            finally:
                shutil.rmtree(profile, ignore_errors=True)

    def dump_dom(self, path):
        return self._run(["--virtual-time-budget=5000", "--dump-dom", "file://" + path])

    def screenshot(self, path, png, width, height):
        if os.path.exists(png):
            os.remove(png)
        # (Without the first two, the bottom of a tall window is sometimes captured before it
        # is painted.)
        return self._run(["--run-all-compositor-stages-before-draw", "--virtual-time-budget=3000",
                          f"--screenshot={png}", f"--window-size={width},{height}", "file://" + path])


def png_facts(path):
    """(width, height, distinct scanlines) of an 8-bit PNG, read with zlib alone. A single-colour
    image has a handful of distinct (filtered) scanlines whatever the encoder's filters."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(colour)
            if depth != 8 or channels is None:
                raise ValueError(f"unexpected PNG format (depth {depth}, colour type {colour})")
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = 1 + width * channels
    if len(raw) != stride * height:
        raise ValueError(f"{len(raw)} bytes of pixels for {width}x{height}")
    rows = {raw[i:i + stride] for i in range(0, len(raw), stride)}
    return width, height, len(rows)


def check_static(results, name, html):
    bad = [s for s in ("http://", "https://", "src=", "url(", "@import") if s in html]
    hrefs = [h for h in re.findall(r'href="([^"]*)"', html) if not h.startswith("#")]
    results.report(f"{name} static", not bad and not hrefs,
                   f"{len(html)} bytes, self-contained" if not bad and not hrefs
                   else f"reaches outside the file: {bad + hrefs}")


def check_dom(results, name, chromium, path, sections, charts):
    proc = chromium.dump_dom(path)
    dom = proc.stdout or ""
    if proc.returncode != 0 or "<html" not in dom:
        results.report(f"{name} dom", False, f"chromium --dump-dom exited {proc.returncode}: {last_line(proc)}")
        results.report(f"{name} selfcheck", False, "no DOM")
        return
    found = re.findall(r'<section id="([a-z-]+)">', dom)
    have_charts = re.findall(r'<svg id="(chart-[a-z-]+)" class="chart"', dom)
    missing_svg = [c for c in charts if c not in have_charts]
    extra = sorted(set(have_charts) - set(charts))
    ok = found == sections and not missing_svg and not extra and len(have_charts) == len(charts)
    results.report(f"{name} dom", ok,
                   f"sections {found}, charts {have_charts}" if ok else
                   f"sections {found} (want {sections}), charts {have_charts} (want {charts})")
    m = re.search(r'<div id="selfcheck" class="selfcheck (\w+)">([^<]*)</div>', dom)
    text = m.group(2) if m else "(no #selfcheck)"
    counts = re.fullmatch(r"ok (\d+) charts, (\d+) bars", text)
    ok = bool(m and m.group(1) == "ok" and counts and int(counts.group(1)) == len(charts)
              and int(counts.group(2)) > 0)
    results.report(f"{name} selfcheck", ok, f"'{text}'" + ("" if ok else f" (want 'ok {len(charts)} charts, ...')"))


def check_screenshot(results, name, chromium, path, png, blank_rows, width=1280, height=2400):
    proc = chromium.screenshot(path, png, width, height)
    if not os.path.isfile(png):
        results.report(f"{name} screenshot", False, f"chromium wrote no PNG (exit {proc.returncode}): "
                                                    f"{last_line(proc)}")
        return
    try:
        w, h, rows = png_facts(png)
    except (ValueError, zlib.error) as e:
        results.report(f"{name} screenshot", False, f"{png}: {e}")
        return
    ok = (w, h) == (width, height) and rows >= 20 * max(blank_rows, 1)
    results.report(f"{name} screenshot", ok,
                   f"{png}: {w}x{h}, {os.path.getsize(png)} bytes, {rows} distinct scanlines "
                   f"(a blank page: {blank_rows})")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sp-bin", required=True, help="directory holding sp-compile, sp-run and sp-tokenize")
    p.add_argument("--workdir", required=True, help="directory for plans, pages and screenshots (created)")
    p.add_argument("--chromium", default=None, help="the browser (default: chromium on PATH)")
    p.add_argument("--steps", type=int, default=8, help="training steps of the run (default 8)")
    p.add_argument("--readme-screenshots", default=None,
                   help="also write report-compile.png and report-run.png (1280x1600) here")
    args = p.parse_args(argv)
    for tool in ("sp-compile", "sp-run", "sp-tokenize"):
        path = os.path.abspath(os.path.join(args.sp_bin, tool))
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            p.exit(2, f"error: {path} not found or not executable: build it first, or pass the build's "
                      "bin/ directory as --sp-bin\n")
        setattr(args, tool.replace("-", "_"), path)
    return args


def main(argv=None):
    args = parse_args(argv)
    results = Results()
    start = time.perf_counter()
    work = os.path.abspath(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    browser = args.chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        results.report("chromium", False, "no chromium on PATH: run tools/dev.sh test (or tools/dev.sh run), "
                                          "which installs the Debian package chromium, or pass --chromium")
        print(f"{results.passed} passed, {results.failed} failed")
        sys.exit(1)
    chromium = Chromium(browser, work)
    version = run([browser, "--version"], timeout=60)
    results.report("chromium", version.returncode == 0, (version.stdout or version.stderr).strip())

    pages = {name: os.path.join(work, f"{name}.html") for name in PAGES}
    out = {name: rel(path) for name, path in pages.items()}
    plain, pipelined = rel(os.path.join(work, "plain.plan")), rel(os.path.join(work, "pipelined.plan"))
    data = rel(os.path.join(work, "data.bin"))
    steps = [
        ("compile-plain", [rel(args.sp_compile), rel(MODEL), "-o", plain, "--html", out["compile-plain"]]),
        ("compile-pipelined", [rel(args.sp_compile), rel(MODEL), "--tp", "2", "--sp", "--pp", "2",
                               "--microbatches", "4", "-o", pipelined, "--html", out["compile-pipelined"]]),
        ("tokenize", [rel(args.sp_tokenize), rel(TEXT), "-o", data, "--split", "0.9"]),
        ("run", [rel(args.sp_run), pipelined, "--data", data, "--val-data", data[:-len(".bin")] + ".val.bin",
                 "--eval-every", str(max(4, args.steps // 10)), "--eval-steps", "2", "--steps", str(args.steps),
                 "--lr", "3e-3", "--warmup", str(min(20, args.steps // 4)), "--log-dir",
                 rel(os.path.join(work, "log")), "--html", out["run"]]),
    ]
    for name, cmd in steps:
        proc = run(cmd)
        tool = os.path.basename(cmd[0])
        if proc.returncode != 0:
            detail = f"{tool} exited {proc.returncode}: {last_line(proc)}"
        elif name != "tokenize" and f"wrote report page {out[name]}" not in proc.stdout:
            detail = f"{tool} did not say 'wrote report page {out[name]}'"
        else:
            detail = f"{tool} ok"
        if not results.report(f"{name} command", detail.endswith(" ok"), detail):
            print(f"{results.passed} passed, {results.failed} failed")
            sys.exit(1)

    # A blank page, screenshotted the same way: what "not blank" is measured against.
    blank = os.path.join(work, "blank.html")
    with open(blank, "w") as f:
        f.write("<!DOCTYPE html><html><body style=\"background:#fff\"></body></html>\n")
    blank_png = os.path.join(work, "blank.png")
    chromium.screenshot(blank, blank_png, 1280, 2400)
    try:
        blank_rows = png_facts(blank_png)[2]
        results.report("blank screenshot", blank_rows <= 8, f"{blank_rows} distinct scanlines")
    except (OSError, ValueError, zlib.error) as e:
        blank_rows = 8
        results.report("blank screenshot", False, f"{blank_png}: {e}")

    shots = []
    for name, (sections, charts) in PAGES.items():
        with open(pages[name], encoding="utf-8") as f:
            html = f.read()
        check_static(results, name, html)
        check_dom(results, name, chromium, pages[name], sections, charts)
        png = os.path.join(work, f"{name}.png")
        check_screenshot(results, name, chromium, pages[name], png, blank_rows)
        shots.append(png)
    assert ALL_CHARTS >= {c for _, charts in PAGES.values() for c in charts}

    if args.readme_screenshots:
        out = os.path.abspath(args.readme_screenshots)
        os.makedirs(out, exist_ok=True)
        for page, target in (("compile-pipelined", "report-compile.png"), ("run", "report-run.png")):
            png = os.path.join(out, target)
            check_screenshot(results, f"README {target}", chromium, pages[page], png, blank_rows, 1280, 1600)
            if os.path.isfile(png):
                shots.append(png)

    print("screenshots (the test's artifacts):")
    for png in shots:
        print(f"  {png}")
    print(f"({time.perf_counter() - start:.1f} s)", flush=True)
    print(f"{results.passed} passed, {results.failed} failed")
    sys.exit(1 if results.failed else 0)


if __name__ == "__main__":
    main()
