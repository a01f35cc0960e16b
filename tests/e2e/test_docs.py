"""The documentation is checked like code: the site builds with
``mkdocs build --strict`` (broken links and anchors fail), the CLI
reference is what the parsers say, and the README stays short."""
import os
import subprocess
import sys

from helpers import ROOT


def test_the_site_builds_strictly(tmp_path):
    mkdocs = os.path.join(os.path.dirname(sys.executable), "mkdocs")
    proc = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for page in ("index.html", "findings/index.html", "cli/index.html", "gpu-check/index.html"):
        assert (tmp_path / "site" / page).exists(), page
    # the Python API reference is rendered from the docstrings themselves
    api = (tmp_path / "site" / "python-api" / "index.html").read_text()
    from commprof import api as api_module

    first = api_module.load.__doc__.split(".")[0].split("(")[0].strip()   # "Open one run"
    assert first in api and "Comparison" in api and "set_run_info" in api


def test_the_cli_reference_is_generated_from_the_parsers():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "docs", "tools", "gen_cli.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_architecture_page_is_the_repositorys_map():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "docs", "tools", "gen_architecture.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_readme_is_short_and_links_only_what_exists():
    import re

    with open(os.path.join(ROOT, "README.md")) as fh:
        text = fh.read()
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)#]+)", text):
        if "://" not in target:
            assert os.path.exists(os.path.join(ROOT, target)), target


def test_the_benchmarks_page_is_generated_from_the_result_files():
    import re

    proc = subprocess.run([sys.executable, os.path.join(ROOT, "docs", "tools", "gen_benchmarks.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # every result is named by date and commit (never by how it was made)
    results = os.path.join(ROOT, "benchmarks", "results")
    for bench in os.listdir(results):
        assert os.path.isdir(os.path.join(results, bench)), bench
        for f in os.listdir(os.path.join(results, bench)):
            assert re.match(r"^\d{4}-\d{2}-\d{2}-[0-9a-f]{7,40}(-[\w.-]+)?\.(md|txt|json|csv|html)$", f), f


def test_the_report_guides_example_is_the_golden_report():
    """docs/report.md's example block is an excerpt of the golden study
    report (compared exactly by test_golden.py): its table rows appear
    there as they are, its finding and evidence too."""
    with open(os.path.join(ROOT, "docs", "report.md")) as fh:
        doc = fh.read()
    with open(os.path.join(ROOT, "tests", "golden", "study", "report.md")) as fh:
        golden = fh.read()
    block = doc.split("An example: the golden *study* trace", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("|")]
    finding = " ".join(line.strip() for line in block.splitlines() if line and not line.startswith("|"))
    assert rows and all(r in golden for r in rows), rows
    head, evidence = finding.split(" of steps ", 1)
    assert f"| {head} of steps | {evidence}" in golden, finding


#: a measured figure: a number with a unit of time, size, rate or a ratio
FIGURE = r"\d[\d,.]*\s?(?:ms|µs|s|%|MB|MiB|GiB|GB/s|MB/s)\b|×\s?\d"
#: where a section may take its figures from: a result file, a test, a fixture
SOURCE = r"benchmarks/results/|tests/|results/"
#: a section whose figures are settings, limits or wording, not measurements, says so
NOT_MEASURED = "<!-- figures: not measurements"
#: so does a paragraph (the comment in the block just before it)
BLOCK_NOT_MEASURED = "<!-- these figures: not measurements"


def _guide_sections():
    import glob
    import re

    generated = ("benchmarks.md", "cli.md", "changelog.md")
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]:
        if os.path.basename(path) in generated:
            continue
        with open(path) as fh:
            text = fh.read()
        for section in re.split(r"\n(?=#+ )", text):
            yield os.path.relpath(path, ROOT), section


def test_every_paragraph_stating_a_figure_names_where_it_was_measured():
    """A figure in the README or a guide comes from a result file (command,
    date and commit inside) or a test, named in its paragraph, list or table
    or in the block just before or after it (a table's caption); numbers
    that are settings, limits or an example's wording say so in an HTML
    comment, for their section or in the block before them. The result
    files named exist."""
    import re

    unbacked, missing = [], []
    for path, section in _guide_sections():
        for ref in re.findall(r"benchmarks/results/[\w./-]+\.(?:md|txt)", section):
            if not os.path.exists(os.path.join(ROOT, ref)):
                missing.append(f"{path}: {ref}")
        if NOT_MEASURED in section:
            continue
        prose = re.sub(r"```.*?```", "", section, flags=re.S)
        blocks = [b for b in re.split(r"\n\s*\n", prose) if b.strip()]
        for i, block in enumerate(blocks):
            m = re.search(FIGURE, block)
            if not m or (i and BLOCK_NOT_MEASURED in blocks[i - 1]):
                continue
            if not re.search(SOURCE, "\n".join(blocks[max(0, i - 1):i + 2])):
                unbacked.append(f"{path} '{section.splitlines()[0]}': ...{block[max(0, m.start() - 60):m.end()]}")
    assert not unbacked, "\n".join(unbacked)
    assert not missing, "\n".join(missing)
