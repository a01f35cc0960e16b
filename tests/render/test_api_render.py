"""The notebook API's cache and the renderers' registry."""
import os

import pytest

import commprof
from commprof import assemble, render
from commprof.cli import build_parser
from tracegen import ddp_rank, write_run


@pytest.fixture
def run2(tmp_path):
    return write_run(tmp_path / "t.parquet", {r: ddp_rank(r, 2, 6) for r in range(2)})


def test_trace_reads_and_analyses_once(run2, monkeypatch):
    calls = []
    real = assemble.iter_chunks

    def counting(*a, **kw):
        calls.append(a[0])
        return real(*a, **kw)

    monkeypatch.setattr(assemble, "iter_chunks", counting)
    t = commprof.load(run2)
    b = t.breakdown()
    t.collectives(), t.skew(), t.stragglers(), t.bottlenecks()
    assert len(calls) == 1
    assert t.report() is t.report()
    t.breakdown(warmup=2)  # other arguments: analysed again
    assert len(calls) == 2
    view = t.filter(ranks=[0])  # a filtered view has its own (empty) cache
    view.breakdown()
    assert len(calls) == 3 and b.iloc[0]["gpus"] == 2


def test_formats_derive_from_the_renderer_classes(tmp_path, run2):
    assert set(render.FORMATS) == {"table", "md", "csv", "json", "html"}
    for name, cls in render.RENDERERS.items():
        assert issubclass(cls, render.Renderer) and cls.name == name
        for ext in cls.extensions:
            assert render.format_for_path(f"report{ext.upper()}") == name
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    fmt = next(a for a in sub["report"]._actions if a.dest == "format")
    assert tuple(fmt.choices) == render.FORMATS
    written = render.write_all(commprof.load(run2).report(), str(tmp_path / "out"))
    names = sorted(os.path.basename(p) for p in written)
    expected = sorted(["report" + c.extensions[0] for c in render.RENDERERS.values() if c.in_out_dir])
    assert [n for n in names if n.startswith("report")] == expected
    assert "breakdown.csv" in names and all(os.path.getsize(p) > 0 for p in written)
