"""Cell values as renderers and exporters need them: is a value missing
(None, NaN, pandas NA / NaT), and the plain Python scalar behind a numpy or
pandas one. Pure Python: nothing is imported."""
from __future__ import annotations

import math
from typing import Any


def missing(v: Any) -> bool:
    """None, a float NaN (Python or numpy), pandas NA or NaT."""
    if v is None:
        return True
    if isinstance(v, float):
        return math.isnan(v)
    if type(v).__name__ in ("NAType", "NaTType"):
        return True
    try:
        return bool(v != v)  # numpy floating NaN
    except (TypeError, ValueError):
        return False


def plain(v: Any, inf_as_none: bool = False) -> Any:
    """A JSON-friendly scalar: None for missing values (and, with
    ``inf_as_none``, infinities), Python int/float/bool/str for numpy ones,
    ``str()`` of anything else."""
    if missing(v):
        return None
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            v = v.item()
        except (TypeError, ValueError):
            pass
    if isinstance(v, float) and inf_as_none and math.isinf(v):
        return None
    return v if isinstance(v, (int, float, str, bool)) else str(v)
