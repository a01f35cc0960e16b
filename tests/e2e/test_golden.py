"""Golden reports: ``commprof report``'s Markdown and JSON on generated
traces, compared exactly with tests/golden/<scenario>/. A difference is a
change of what users read; when it is meant, regenerate with

    .venv/bin/python tests/golden/make_golden.py

and review the diff of tests/golden/ like code."""
import os
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "golden"))
import make_golden  # noqa: E402


@pytest.mark.parametrize("scenario", sorted(make_golden.SCENARIOS))
def test_report_matches_golden(scenario):
    got = make_golden.render(scenario)
    for fname, text in got.items():
        with open(os.path.join(make_golden.HERE, scenario, fname)) as fh:
            want = fh.read()
        assert text == want, f"{scenario}/{fname} differs from the golden output (see the module docstring)"
