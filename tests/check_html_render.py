"""Render commprof's HTML report in headless Chromium and check it the way a
reader sees it (run by tests/render/test_html_render.py; also by hand):

    python tests/check_html_render.py REPORT.html [--screenshot DIR]
    python tests/check_html_render.py            # a 2-configuration x 3-GPU-count study

A copy of the report gets a small checking script (the report itself is not
changed) that, once the page has loaded and plotly has drawn, records:
every figure drawn (a plotly SVG in each figure box), no JavaScript error
or ``console.error``, no tick label, axis title, figure title or legend
text cut off at its figure's edge, no horizontal page overflow (wide tables
scroll inside their box), every figure with a title, axis titles and a
one-line "how to read this", and the contrast of body text against the page
background — in the light and in the dark colour scheme
(``--force-dark-mode``). Chromium runs with ``--dump-dom`` (JavaScript runs,
no network); exit 1 if a check fails."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--virtual-time-budget=15000"]
WINDOW = "1100,1400"

#: injected first in <head>: collect errors before any other script runs
_CATCH = """<script>window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message || e)); });
(function () { var orig = console.error; console.error = function () {
  window.__errors.push(Array.prototype.join.call(arguments, ' ')); return orig.apply(console, arguments); }; })();
</script>"""

#: injected last in <body>: the checks, written into <pre id="commprof-check">
_CHECK = r"""<script>
window.addEventListener('load', function () { setTimeout(function () {
  function lum(c) { var m = c.match(/[\d.]+/g).map(Number).slice(0, 3).map(function (v) {
    v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * m[0] + 0.7152 * m[1] + 0.0722 * m[2]; }
  var out = {figures: 0, drawn: 0, cut: [], untitled: [], errors: window.__errors, overflow: 0};
  document.querySelectorAll('.fig').forEach(function (fig) {
    out.figures += 1;
    if (fig.querySelector('svg.main-svg')) out.drawn += 1;
    var box = fig.getBoundingClientRect();
    fig.querySelectorAll('.xtick text, .ytick text, .y2tick text, .g-xtitle text, .g-ytitle text, ' +
                         '.g-y2title text, .gtitle, .legendtext').forEach(function (t) {
      var r = t.getBoundingClientRect();
      if (!r.width) return;
      if (r.left < box.left - 2 || r.right > box.right + 2 || r.top < box.top - 2 || r.bottom > box.bottom + 2)
        out.cut.push(fig.id + ': ' + t.textContent);
    });
    var lay = fig.layout || {}, how = fig.previousElementSibling;
    function txt(a) { return a && a.title && (a.title.text || (typeof a.title === 'string' && a.title)); }
    if (!txt(lay)) out.untitled.push(fig.id + ': no figure title');
    if (!txt(lay.xaxis)) out.untitled.push(fig.id + ': no x axis title');
    if (!txt(lay.yaxis)) out.untitled.push(fig.id + ': no y axis title');
    if (!how || !how.classList.contains('how') || !how.textContent.trim())
      out.untitled.push(fig.id + ': no how-to-read line');
  });
  out.overflow = document.documentElement.scrollWidth - window.innerWidth;
  var bs = getComputedStyle(document.body);
  var a = lum(bs.color), b = lum(bs.backgroundColor);
  out.contrast = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  out.dark = window.matchMedia('(prefers-color-scheme: dark)').matches;
  var pre = document.createElement('pre'); pre.id = 'commprof-check';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
}, 300); });
</script>"""


def find_chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def check(html_path: str, chromium: str, dark: bool = False, screenshot: str = None) -> dict:
    """Load ``html_path`` (a copy with the checking script) in headless
    Chromium; returns the checks' results (see the module docstring)."""
    text = open(html_path, encoding="utf-8").read()
    checked = text.replace("<head>", "<head>" + _CATCH, 1).replace("</body>", _CHECK + "</body>", 1)
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "checked.html")
        with open(page, "w", encoding="utf-8") as fh:
            fh.write(checked)
        flags = FLAGS + [f"--user-data-dir={os.path.join(tmp, 'profile')}", f"--window-size={WINDOW}"]
        if dark:
            flags.append("--force-dark-mode")
        proc = subprocess.run([chromium, *flags, "--dump-dom", "file://" + page],
                              capture_output=True, text=True, timeout=180)
        m = re.search(r'<pre id="commprof-check">(.*?)</pre>', proc.stdout, re.S)
        if not m:
            raise RuntimeError(f"chromium gave no check result (exit {proc.returncode}): {proc.stderr[-1500:]}")
        import html as _html

        result = json.loads(_html.unescape(m.group(1)))
        if screenshot:
            os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
            subprocess.run([chromium, *FLAGS, f"--user-data-dir={os.path.join(tmp, 'shot')}",
                            "--window-size=1300,4000", *(["--force-dark-mode"] if dark else []),
                            f"--screenshot={os.path.abspath(screenshot)}", "file://" + os.path.abspath(html_path)],
                           capture_output=True, timeout=180)
    return result


def problems(result: dict, min_figures: int = 1) -> list:
    """What is wrong, as sentences (empty: all checks pass)."""
    out = []
    if result["figures"] < min_figures:
        out.append(f"{result['figures']} figures (expected at least {min_figures})")
    if result["drawn"] != result["figures"]:
        out.append(f"only {result['drawn']} of {result['figures']} figures drawn")
    out += [f"JavaScript error: {e}" for e in result["errors"]]
    out += [f"label cut off: {c}" for c in result["cut"]]
    out += result["untitled"]
    if result["overflow"] > 1:
        out.append(f"the page is {result['overflow']} px wider than the window (a table does not scroll in its box)")
    if result["contrast"] < 7:
        out.append(f"body text contrast {result['contrast']:.1f}:1 (want >= 7)")
    return out


def study_report(out_html: str) -> str:
    """A 2-configuration x 3-GPU-count study's HTML report from tracegen traces."""
    sys.path[:0] = [HERE, os.path.dirname(HERE)]
    from commprof.cli import main as commprof_main
    from tracegen import ddp_rank, write_run

    d = os.path.dirname(os.path.abspath(out_html))
    runs = []
    for loader, data_ms in (("native", 4), ("dali", 1)):
        for n in (1, 2, 4):
            rows = {r: ddp_rank(r, n, 8, data_ms=data_ms, buckets=0 if n == 1 else 2, bucket_ms=2 * n,
                                arrive_ms=0.4 * r) for r in range(n)}
            runs.append(write_run(os.path.join(d, f"{loader}{n}.parquet"), rows,
                                  meta={"loader": loader, "framework": "none" if n == 1 else "ddp"}))
    assert commprof_main(["report", *runs, "-o", out_html]) == 0
    return out_html


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("report", nargs="?", default=None, help="an HTML report (default: build a study report)")
    p.add_argument("--screenshot", default=None, metavar="DIR", help="write light.png and dark.png into DIR")
    p.add_argument("--chromium", default=find_chromium())
    args = p.parse_args()
    if not args.chromium:
        sys.exit("chromium not found (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.report or study_report(os.path.join(tmp, "report.html"))
        failed = False
        for dark in (False, True):
            shot = os.path.join(args.screenshot, "dark.png" if dark else "light.png") if args.screenshot else None
            r = check(path, args.chromium, dark=dark, screenshot=shot)
            bad = problems(r)
            failed |= bool(bad)
            print(f"{'dark' if dark else 'light'}: {r['drawn']}/{r['figures']} figures drawn, "
                  f"contrast {r['contrast']:.1f}:1, {len(r['cut'])} labels cut, {len(r['errors'])} JS errors: "
                  + ("OK" if not bad else "FAIL: " + "; ".join(bad)))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
