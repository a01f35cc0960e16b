"""The streaming Chrome export writes exactly what ``json.dump`` of the
whole document wrote (checked against a reference that builds every event
as a dict, on a multi-rank synthetic trace with missing values), one file
per rank the same way, and warns past the size the viewers load."""
import gzip
import json
import os
import sys

import pandas as pd
import pytest

from commprof.api import load
from commprof.convert import chrome
from helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from synth import write  # noqa: E402


def _reference(ev: pd.DataFrame, rank: int, base: int, host):
    """Every event as a dict, one row at a time (the export's definition)."""
    from commprof.trace.values import plain as val

    out = chrome._header_events(rank, host)
    cpu, gpu = chrome.CPU_PID + rank, rank
    last_end = None
    for r in ev.itertuples(index=False):
        cat, name = str(r.category), str(r.name)
        ts, dur = chrome._us(r.t_start, base), max(0.0, (int(r.t_end) - int(r.t_start)) / 1000.0)
        if cat == "step":
            out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{int(r.step)}", "pid": cpu,
                        "tid": 1, "ts": ts, "dur": dur, "args": {"items": val(r.items)}})
            last_end = max(last_end or 0, int(r.t_end))
        elif cat in ("data", "wait"):
            out.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": cpu, "tid": chrome.TID[cat],
                        "ts": ts, "dur": dur, "args": {"step": int(r.step)}})
        elif cat == "compute":
            out.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": cpu, "tid": 3, "ts": ts,
                        "dur": dur, "args": {"step": int(r.step), "detail": val(r.detail)}})
            out.append({"ph": "X", "cat": "kernel", "name": f"commprof::{name}", "pid": gpu, "tid": 7, "ts": ts,
                        "dur": dur, "args": {"device": 0, "stream": 7, "step": int(r.step)}})
        elif cat == "comm":
            op = "".join(w.capitalize() for w in name.split("_"))
            out.append({"ph": "X", "cat": "kernel", "name": f"ncclKernel_{op}_commprof", "pid": gpu, "tid": 20,
                        "ts": ts, "dur": dur, "args": {
                            "device": 0, "stream": 20, "Collective name": name, "bytes": val(r.bytes),
                            "dtype": val(r.dtype), "Group size": val(r.group_size), "Process Group Name": val(r.group),
                            "seq": val(r.seq), "blocking": val(r.blocking), "source": val(r.source),
                            "step": int(r.step)}})
    if last_end is not None:
        out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{int(ev['step'].max()) + 1}",
                    "pid": cpu, "tid": 1, "ts": chrome._us(last_end, base) + 1.0, "dur": 0.0,
                    "args": {"end_marker": True}})
    return out


def _reference_flows(ev, base):
    c = ev[(ev["category"].astype(str) == "comm") & ev["seq"].notna() & ev["group"].notna()]
    out = []
    for i, ((_g, seq), g) in enumerate(c.groupby([c["group"].astype(str), "seq"], sort=False)):
        if g["rank"].nunique() < 2:
            continue
        g = g.sort_values("t_start", kind="stable")
        first = g.iloc[0]
        label = f"{first['name']} seq {int(seq)}"
        out.append({"ph": "s", "id": i + 1, "name": label, "cat": "collective", "pid": int(first["rank"]),
                    "tid": 20, "ts": chrome._us(first["t_start"], base)})
        for _, r in g.iloc[1:].iterrows():
            out.append({"ph": "f", "bp": "e", "id": i + 1, "name": label, "cat": "collective",
                        "pid": int(r["rank"]), "tid": 20, "ts": chrome._us(r["t_start"], base)})
    return out


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    from commprof.assemble import merge

    d = tmp_path_factory.mktemp("synth")
    shards, _n = write(str(d), 6, 40)
    path = str(d / "trace.parquet")
    merge(shards, path, {"run_id": "t"})
    return path


def test_the_merged_file_is_what_json_dump_of_every_event_wrote(trace, tmp_path):
    t = load(trace)
    ev = t.events(chrome.COLUMNS)
    ev = ev[ev["category"].astype(str) != "metric"]
    base = int(ev["t_start"].min())
    hosts = {int(m["rank"]): m.get("host") for m in t.ranks}
    events = [e for r, g in ev.groupby("rank") for e in _reference(g, int(r), base, hosts.get(int(r)))]
    events += _reference_flows(ev, base)
    out = str(tmp_path / "t.json")
    chrome.export_chrome(t, out)
    text = open(out).read()
    doc = json.loads(text)
    assert doc["traceEvents"] == events
    # byte for byte: the whole document as json.dump writes it
    assert text == json.dumps(doc)
    assert any(e["ph"] == "s" for e in events) and any(e["args"].get("bytes") is None for e in events if "args" in e)
    assert not chrome.validate(doc)


def test_per_rank_gzip_files_and_a_subset(trace, tmp_path):
    t = load(trace)
    paths = chrome.export_chrome(t, str(tmp_path / "r.json.gz"), per_rank=True, steps=(3, 9), ranks=[1, 4])
    assert [os.path.basename(p) for p in paths] == ["r.rank1.json.gz", "r.rank4.json.gz"]
    view = t.filter(ranks=[4], steps=(3, 9))
    ev = view.events(chrome.COLUMNS)
    ev = ev[ev["category"].astype(str) != "metric"]
    base = int(load(trace).filter(ranks=[1, 4], steps=(3, 9)).events(["t_start"])["t_start"].min())
    with gzip.open(paths[1], "rt") as fh:
        doc = json.load(fh)
    assert doc["distributedInfo"]["rank"] == 4
    assert doc["traceEvents"] == _reference(ev, 4, base, {int(m["rank"]): m.get("host") for m in t.ranks}.get(4))


def test_a_large_timeline_gets_a_warning_naming_steps_and_ranks(trace, tmp_path, monkeypatch):
    said = []
    monkeypatch.setattr(chrome, "VIEWER_EVENTS", 100)
    chrome.export_chrome(load(trace), str(tmp_path / "w.json"), warn=said.append)
    assert len(said) == 1 and "--steps" in said[0] and "--ranks" in said[0] and "Perfetto" in said[0]
