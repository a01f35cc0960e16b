"""When a job did not end cleanly: how each rank ended, which ended first,
and the first collective the ranks disagree on in their rings.

Input: a run's metadata (``job_exit`` from ``commprof record``, ``ends``
from the assembler: per rank how it ended, where, the collectives it was
inside and its ring's last collectives as [group, seq, op, bytes, dtype,
source, completed, writer]; ``trace/ends.py``, ``trace/ring.py``). Output: a table (one row per rank, the first to end
first) and findings. Pure: no file is read here."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

COLUMNS = ["rank", "host", "pid", "ended", "after_s", "step", "where", "in_flight", "detail"]


def failed(meta: Dict[str, Any]) -> bool:
    """True when the job exited non-zero or a rank did not exit normally."""
    code = (meta.get("job_exit") or {}).get("code")
    return code not in (None, 0) or any(e.get("how") != "exit" for e in meta.get("ends") or [])


def how(e: Dict[str, Any]) -> str:
    h = e.get("how")
    if h == "signal":
        verb = {"SIGABRT": "aborted", "SIGSEGV": "crashed", "SIGBUS": "crashed", "SIGFPE": "crashed",
                "SIGILL": "crashed", "SIGTERM": "terminated"}.get(str(e.get("signal")), "died")
        return f"{verb} ({e.get('signal')})"
    if h == "exception":
        return f"raised {e.get('type')}"
    if h == "killed":
        return "killed (no handler ran: SIGKILL or the node went down)"
    return "exited"


def _call(c) -> str:
    nbytes = c.get("bytes")
    size = f"{int(nbytes):,} B" if nbytes is not None else "? B"
    return f"{c.get('op')} {size} (group {c.get('group')} #{c.get('seq')}, {c.get('source')})"


def ends_table(meta: Dict[str, Any]) -> pd.DataFrame:
    """One row per rank, those that did not exit first, in the order they ended."""
    ends = list(meta.get("ends") or [])
    if not ends:
        return pd.DataFrame(columns=COLUMNS)
    bad = [e for e in ends if e.get("how") != "exit"]
    t0 = min((int(e["wall_ns"]) for e in bad if e.get("wall_ns")), default=None)
    rows = []
    for e in ends:
        t = e.get("wall_ns")
        detail = e.get("message") or ""
        if e.get("how") == "signal" and e.get("in_backend_thread"):
            detail = "in a backend thread (no Python frames); the main thread's stack is shown"
        rows.append({"rank": e.get("rank"), "host": e.get("host"), "pid": e.get("pid"), "ended": how(e),
                     "after_s": (int(t) - t0) / 1e9 if t and t0 is not None and e.get("how") != "exit" else None,
                     "step": e.get("step", e.get("steps")), "where": e.get("user_where") or e.get("where") or "",
                     "in_flight": "; ".join(_call(c) for c in e.get("in_flight") or []) or "nothing",
                     "detail": _short(detail)})
    out = pd.DataFrame(rows, columns=COLUMNS)
    out["_bad"] = out["ended"] != "exited"
    out = out.sort_values(["_bad", "after_s", "rank"], ascending=[False, True, True], na_position="last")
    return out.drop(columns="_bad").reset_index(drop=True)


def _short(text: str, n: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


Sig = Tuple[str, Optional[int], Optional[str], str]


def disagreement(meta: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The first (group, seq) in the ranks' rings where they disagree (op,
    bytes, dtype or issuer), or where some ranks issued a collective that a
    rank whose ring ends earlier never issued; None when the rings agree
    (or there are none)."""
    ends = [e for e in meta.get("ends") or [] if e.get("last")]
    if len(ends) < 2:
        return None
    per: Dict[str, Dict[int, Dict[int, Sig]]] = {}   # group -> seq -> rank -> signature
    top: Dict[Tuple[str, int], int] = {}              # (group, rank) -> last seq in its ring
    low: Dict[Tuple[str, int], int] = {}
    for e in ends:
        r = int(e["rank"])
        for g, seq, op, nbytes, dtype, source, *_done_writer in e["last"]:
            per.setdefault(g, {}).setdefault(int(seq), {})[r] = (op, nbytes, dtype, source)
            top[(g, r)] = max(top.get((g, r), -1), int(seq))
            low[(g, r)] = min(low.get((g, r), 1 << 62), int(seq))
    found: List[Dict[str, Any]] = []
    for g, seqs in per.items():
        ranks = sorted({r for (gg, r) in top if gg == g})
        for seq in sorted(seqs):
            at = seqs[seq]
            # ranks whose ring covers this seq's neighbourhood but lack it
            missing = [r for r in ranks if r not in at and low[(g, r)] <= seq and top[(g, r)] < seq]
            if len(set(at.values())) > 1:
                found.append({"group": g, "seq": seq, "kind": "disagree", "sides": at, "missing": missing})
                break
            if missing:
                found.append({"group": g, "seq": seq, "kind": "missing", "sides": at, "missing": missing})
                break
    if not found:
        return None
    return min(found, key=lambda f: f["seq"])


def describe(d: Dict[str, Any]) -> str:
    by_sig: Dict[Sig, List[int]] = {}
    for r, s in d["sides"].items():
        by_sig.setdefault(s, []).append(r)
    parts = []
    for (op, nbytes, dtype, source), ranks in sorted(by_sig.items(), key=lambda kv: min(kv[1])):
        size = f"{int(nbytes):,} B" if nbytes is not None else "? B"
        who = "rank " + ",".join(str(r) for r in sorted(ranks))
        parts.append(f"{who} {op} {size} {dtype or ''} from {_issuer(source)}".replace("  ", " "))
    text = f"group {d['group']} #{d['seq']}: " + "; ".join(parts)
    if d["missing"]:
        text += f"; rank {','.join(str(r) for r in d['missing'])} never issued it (its ring ends before)"
    return text


def _issuer(source: str) -> str:
    return {"ddp_reducer": "the DDP reducer", "torch.distributed": "user code (torch.distributed)",
            "horovod": "Horovod"}.get(source, source or "?")


def findings(meta: Dict[str, Any], config: str = "", gpus: int = 0) -> List[Dict[str, Any]]:
    """The failure finding of a run that did not end cleanly (first in a report)."""
    if not failed(meta):
        return []
    t = ends_table(meta)
    code = (meta.get("job_exit") or {}).get("code")
    exit_text = (f"exit status {code}" if code is not None and code >= 0
                 else f"killed by {(meta.get('job_exit') or {}).get('signal', '?')}" if code is not None else "")
    bad = t[t["ended"] != "exited"]
    if len(bad):
        first = bad.iloc[0]
        head = f"job failed: rank {first['rank']} {first['ended']}"
        if first["in_flight"] != "nothing":
            head += f" in {first['in_flight'].split(' (')[0]}"
        head += f", step {first['step']}" if first["step"] is not None else ""
        head += f", at {first['where']}" if first["where"] else ""
        others = [f"rank {r['rank']} {r['ended']} {r['after_s']:.2f} s later" if r["after_s"] is not None
                  else f"rank {r['rank']} {r['ended']}" for _, r in bad.iloc[1:].iterrows()]
        clean = t[t["ended"] == "exited"]["rank"].tolist()
        evidence = "; ".join(x for x in [
            f"first to end{': ' + first['detail'] if first['detail'] else ''}",
            ", ".join(others[:6]) + (f" and {len(others) - 6} more" if len(others) > 6 else ""),
            f"rank(s) {','.join(str(r) for r in clean[:16])} exited" if clean else "",
            exit_text] if x)
    else:
        head, evidence = f"job failed ({exit_text})", "every rank exited normally; the launcher reported the failure"
    d = disagreement(meta)
    if d is not None:
        evidence += f"; first disagreement in the rings: {describe(d)}"
        advice = ("the ranks' collective sequences diverged there (a rank skipped, added or reordered a "
                  "collective, or shapes differ by rank): make every rank issue the same collectives in the "
                  "same order; the performance findings below cover only the steps before the failure")
    else:
        n = min((len(e.get("last") or []) for e in meta.get("ends") or [] if e.get("last")), default=0)
        evidence += (f"; no disagreement in the last {n} collectives of the rings" if n
                     else "; no collective ring (no collective was recorded)")
        advice = ("see the failing rank's stack and error above; the performance findings below cover only "
                  "the steps before the failure")
    return [{"config": config, "gpus": int(gpus), "bound": "failure", "finding": head, "evidence": evidence,
             "advice": advice}]
