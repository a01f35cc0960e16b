"""NVTX ranges only where an NVTX tool listens (nothing else sees them)."""
import pytest

from commprof.record import nvtx


def test_no_nvtx_calls_without_a_tool(monkeypatch):
    for var in nvtx.INJECTION_VARS + ("COMMPROF_NVTX",):
        monkeypatch.delenv(var, raising=False)
    assert not nvtx.tool_attached()
    assert nvtx.make(True).enabled is False
    assert nvtx.make(False).enabled is False


@pytest.mark.parametrize("var,value", [("NVTX_INJECTION64_PATH", "/opt/nsys/libToolsInjection64.so"),
                                       ("COMMPROF_NVTX", "1")])
def test_ranges_when_a_tool_is_injected_or_forced(monkeypatch, var, value):
    pytest.importorskip("nvtx")
    for v in nvtx.INJECTION_VARS + ("COMMPROF_NVTX",):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv(var, value)
    assert nvtx.tool_attached()
    on = nvtx.make(True)
    assert on.enabled is True
    rid = on.start("all_reduce")  # real calls into the nvtx package: harmless without the tool library
    on.push("forward")
    on.pop()
    on.end(rid)
    assert nvtx.make(False).enabled is False  # --no-nvtx wins
