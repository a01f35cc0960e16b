"""The step clock of one process: which optimizer step events belong to,
when the current step started, and how many samples it processed.

A step ends when an optimizer step ends (``optimizer_done``), unless a
framework's own step is running around it (DeepSpeed's ``engine.step``,
see ``hold`` / ``release``): then the step ends when that returns, so ZeRO's
parameter gathers after the inner optimizer step belong to the step."""
from __future__ import annotations

from typing import Dict, Optional, Tuple


class StepClock:
    def __init__(self):
        self.step = 0
        self.start: Optional[int] = None
        self.first_activity: Optional[int] = None
        self.items: Dict[str, int] = {}
        self.data_items = 0
        #: root module description -> parameter count (for the items rule)
        self.models: Dict[str, int] = {}
        self._hold = 0
        self._held_steps = 0

    # -- what instruments report ----------------------------------------------
    def activity(self, t0: int) -> None:
        if self.first_activity is None:
            self.first_activity = t0

    def note_items(self, detail: str, n: int) -> None:
        self.items[detail] = self.items.get(detail, 0) + n

    def note_data_items(self, n: int) -> None:
        self.data_items += n

    def note_model(self, detail: str, params: int) -> None:
        self.models[detail] = max(self.models.get(detail, 0), params)

    def hold(self) -> None:
        self._hold += 1

    def release(self) -> bool:
        """End of a framework step; True when the held step must end now."""
        self._hold -= 1
        if self._hold == 0 and self._held_steps:
            self._held_steps = 0
            return True
        return False

    def optimizer_done(self) -> bool:
        """An optimizer step ended; True when the training step ends with it."""
        if self._hold:
            self._held_steps += 1
            return False
        return True

    # -- closing a step ------------------------------------------------------
    def close(self, t_end: int) -> Tuple[int, int, Optional[int]]:
        """End the current step at ``t_end``: returns (step, start, items)
        and moves on to the next step."""
        start = self.start
        if start is None:
            start = self.first_activity if self.first_activity is not None else t_end
        out = (self.step, start, self._items_this_step())
        self.step += 1
        self.start = t_end
        self.items = {}
        self.data_items = 0
        return out

    def _items_this_step(self) -> Optional[int]:
        """Samples this rank processed in the step: what the data loader
        delivered if it was used (sums micro-batches of gradient
        accumulation, ignores repeated forwards of one batch), else the
        leading dimension of the inputs of the largest root module."""
        if self.data_items:
            return self.data_items
        best, best_params = None, 0
        for detail, n in self.items.items():
            p = self.models.get(detail, 0)
            if p > best_params:
                best, best_params = n, p
        return best
