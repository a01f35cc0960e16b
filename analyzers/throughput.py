"""Step time and throughput.

- step time: per (rank, step), end of the previous optimizer step to the end
  of this one; median and p95 over all measured (rank, step) pairs;
- steps/s: per rank, measured steps / their summed duration; mean over ranks;
- samples/s (global): sum over ranks of (samples the rank processed in the
  measured steps / their summed duration). Samples per step on a rank are
  the leading dimension of the model's input (the root module with the most
  parameters, all its forwards of the step), or ``batch_size`` if given.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd


def throughput(steps: pd.DataFrame, batch_size: Optional[int] = None) -> dict:
    if steps.empty:
        return {"steps": 0, "step_ms_median": np.nan, "step_ms_p95": np.nan,
                "steps_per_s": np.nan, "samples_per_s": np.nan, "batch_per_rank": np.nan}
    per_rank = steps.groupby("rank").agg(n=("step", "size"), t=("step_time", "sum"),
                                         items=("items", "sum"), items_med=("items", "median"))
    secs = per_rank["t"] / 1e9
    steps_per_s = float((per_rank["n"] / secs).mean())
    if batch_size:
        samples = per_rank["n"] * batch_size
        batch = float(batch_size)
    else:
        samples = per_rank["items"]
        batch = float(per_rank["items_med"].median()) if per_rank["items_med"].notna().any() else np.nan
    samples_per_s = float((samples / secs).sum()) if samples.notna().all() and samples.sum() > 0 else np.nan
    st = steps["step_time"].to_numpy() / 1e6
    return {
        "steps": int(per_rank["n"].max()),
        "step_ms_median": float(np.median(st)),
        "step_ms_p95": float(np.percentile(st, 95)),
        "steps_per_s": steps_per_s,
        "samples_per_s": samples_per_s,
        "batch_per_rank": batch,
    }
