"""The HTML report in a real browser (headless Chromium, installed by
``make test`` where apt exists): every figure draws, no JavaScript error,
no label cut off, wide tables scroll inside their box, titles and
how-to-read lines present, readable in the light and the dark colour
scheme. Screenshots go to ``$COMMPROF_ARTIFACTS`` (default: artifacts/ in
the repository), kept by CI."""
import os
import sys

import pytest

import commprof
from helpers import ROOT, commprof_cmd, documented_scaled, run, venv_env

sys.path.insert(0, os.path.join(ROOT, "tests"))
import check_html_render as chk  # noqa: E402

ARTIFACTS = os.environ.get("COMMPROF_ARTIFACTS") or os.path.join(ROOT, "artifacts")


@pytest.fixture(scope="module")
def chromium():
    path = chk.find_chromium()
    if not path:
        pytest.skip("no chromium here (make test installs Debian's chromium where it runs as root with apt)")
    return path


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_study_report_renders(chromium, tmp_path, dark):
    """Two configurations x three GPU counts: 4 figures, all checks pass."""
    html = chk.study_report(str(tmp_path / "study.html"))
    shot = os.path.join(ARTIFACTS, "html", f"study-{'dark' if dark else 'light'}.png")
    result = chk.check(html, chromium, dark=dark, screenshot=shot)
    assert result["dark"] is dark
    assert chk.problems(result, min_figures=4) == []
    assert os.path.getsize(shot) > 10_000


def test_the_checks_catch_a_broken_report(chromium, tmp_path):
    """A report with a JS error, labels pushed off the figure and a table
    that does not scroll fails each of those checks."""
    text = open(chk.study_report(str(tmp_path / "ok.html")), encoding="utf-8").read()
    broken = (text.replace("<div class='scroll'>", "<div>").replace('"automargin": true', '"automargin": false')
              .replace('"margin": {"t": 50, "r": 30}', '"margin": {"t": 50, "r": 30, "l": 0}')
              .replace("</body>", "<script>noSuchFunction()</script></body>"))
    path = tmp_path / "broken.html"
    path.write_text(broken, encoding="utf-8")
    bad = chk.problems(chk.check(str(path), chromium))
    assert any("noSuchFunction" in b for b in bad)
    assert any(b.startswith("label cut off: fig0") for b in bad)
    assert any("wider than the window" in b for b in bad)


@pytest.mark.slow
def test_demo_report_renders(chromium, tmp_path):
    """What ``make demo`` shows (ResNet-18, DDP, 2 CPU ranks, here with
    fewer and smaller steps) next to its 1-process run, swept as the sweep
    guide shows: the report draws in
    both colour schemes; screenshots kept. (Its two CPU ranks share this
    machine's two cores with the launcher, so they need not be equal: one
    was measured 30 ms late in 9 of 9 steps once. Equal and unequal ranks
    by construction are tests/record/test_equal_ranks.py.)"""
    env = venv_env()
    # the sweep guide's command, one loader at 1 and 2 ranks: the runs make demo records, as one study
    study = str(tmp_path / "study")
    words = documented_scaled("docs/sweep-predict.md", "--vary loader=native,dali",
                              "one loader at 1 and 2 CPU ranks, 8 small steps: the demo's runs",
                              values={"--nproc": "1,2", "--vary": "loader=native"}, outputs={"study": study},
                              after=["--steps", "8", "--image-size", "32", "--no-val"])
    proc = run(commprof_cmd(*words), timeout=400, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    html = str(tmp_path / "report.html")
    proc = run(commprof_cmd("report", study, "-o", html), env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(commprof.load(study).report().tables["breakdown"].frame["gpus"]) == [1, 2]
    for dark in (False, True):
        shot = os.path.join(ARTIFACTS, "html", f"demo-{'dark' if dark else 'light'}.png")
        result = chk.check(html, chromium, dark=dark, screenshot=shot)
        assert chk.problems(result, min_figures=4) == [], result


def test_predict_report_renders(chromium, tmp_path):
    """commprof predict's HTML: measured points, the predicted curve with
    its interval and what-ifs draw, labels inside, both colour schemes."""
    import tracegen

    runs = []
    for n in (2, 4):
        runs.append(tracegen.write_run(str(tmp_path / f"n{n}.parquet"), tracegen.modelled_run(n, 12, seed=n)))
    html = str(tmp_path / "predict.html")
    proc = run(commprof_cmd("predict", *runs, "--to", "8,64,1024", "--what-if", "bandwidth=2x", "-o", html))
    assert proc.returncode == 0, proc.stderr
    assert "Measured vs predicted throughput" in open(html, encoding="utf-8").read()
    for dark in (False, True):
        shot = os.path.join(ARTIFACTS, "html", f"predict-{'dark' if dark else 'light'}.png")
        assert chk.problems(chk.check(html, chromium, dark=dark, screenshot=shot), min_figures=1) == []


def test_pairs_heat_map_renders(chromium, tmp_path):
    """`commprof bench --pairs` as HTML (a slow node among four): the heat map
    drawn with its title, axis titles and how-to-read line, nothing cut."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "analyzers"))
    from test_pairs import _samples

    from commprof import render
    from commprof.analyzers import pairs as pr
    from commprof.analyzers.report import pairs_report

    samples, hosts = _samples(4, lambda a, b: 6.25e6 if "node2" in (a, b) else 25e6)
    doc = {"world_size": 4, "hosts": hosts, "rounds": pr.plan(hosts), "bytes": 1 << 20, "iters": 9, "warmup": 2,
           "samples": samples.to_dict("records")}
    html = tmp_path / "pairs.html"
    html.write_text(render.get("html").render(pairs_report(doc)))
    result = chk.check(str(html), chromium, screenshot=os.path.join(ARTIFACTS, "html", "pairs-light.png"))
    assert chk.problems(result, min_figures=1) == []
