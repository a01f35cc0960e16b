"""Render commprof's HTML report in headless Chromium and check that every
figure was drawn (a documented check, not part of `make test`, since it
needs Debian's ``chromium`` package: ``apt-get install chromium``).

    python tests/check_html_render.py [--screenshot report.png]

Builds a report from hand-made traces at 2 and 4 GPUs, loads it with
``chromium --headless --dump-dom`` (JavaScript runs, no network), and checks
that the DOM holds one plotly SVG per figure; exits 1 otherwise."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from commprof.cli import main as commprof_main  # noqa: E402
from tracegen import ddp_rank, write_run  # noqa: E402

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=10000"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--screenshot", default=None)
    p.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = p.parse_args()
    if not args.chromium:
        sys.exit("chromium not found (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        runs = [write_run(os.path.join(tmp, f"w{w}.parquet"),
                          {r: ddp_rank(r, w, 8, bucket_ms=6 + w, arrive_ms=r * 0.3) for r in range(w)})
                for w in (2, 4)]
        html_path = os.path.join(tmp, "report.html")
        assert commprof_main(["report", *runs, "-o", html_path]) == 0
        n_figs = open(html_path).read().count("Plotly.newPlot(")
        profile = os.path.join(tmp, "profile")
        dom = subprocess.run([args.chromium, *FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                              "file://" + html_path], capture_output=True, text=True, timeout=120).stdout
        drawn = len(re.findall(r'class="main-svg"', dom))
        if args.screenshot:
            subprocess.run([args.chromium, *FLAGS, f"--user-data-dir={profile}", "--window-size=1400,2400",
                            f"--screenshot={os.path.abspath(args.screenshot)}", "file://" + html_path],
                           capture_output=True, timeout=120)
    # plotly draws two "main-svg" layers per figure
    ok = n_figs >= 4 and drawn >= 2 * n_figs
    print(f"{n_figs} figures in the HTML, {drawn} plotly SVG layers in Chromium's DOM: {'OK' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
