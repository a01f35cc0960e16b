"""The notebooks run top to bottom on traces the test generates."""
import os

import pytest

from tracegen import ddp_rank, write_run

nbformat = pytest.importorskip("nbformat")
pytestmark = pytest.mark.slow  # runs a Jupyter kernel per notebook

NB = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "notebooks")


@pytest.fixture
def traces(tmp_path):
    a = write_run(tmp_path / "w2.parquet", {r: ddp_rank(r, 2, 8, arrive_ms=r * 0.5) for r in range(2)})
    b = write_run(tmp_path / "w4.parquet", {r: ddp_rank(r, 4, 8, bucket_ms=12, arrive_ms=r * 0.5)
                                            for r in range(4)})
    return a, b


@pytest.mark.parametrize("name", ["explore.ipynb", "compare.ipynb"])
def test_notebook_runs(name, traces, monkeypatch, tmp_path):
    from nbclient import NotebookClient

    path = os.path.join(NB, name)
    nb = nbformat.read(path, as_version=4)
    # stored without outputs
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code")
    monkeypatch.setenv("COMMPROF_TRACE", traces[1])
    monkeypatch.setenv("COMMPROF_TRACES", ",".join(traces))
    root = os.path.dirname(NB)
    monkeypatch.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": NB}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert all(c.outputs for c in nb.cells if c.cell_type == "code")
