"""Units of scheduling work, and a meter that caps the list-scheduler runs made under it.

A unit is a scheduling step or a dry run of an op on a device; a copy given a slot on the
channels (booked, or tried in a dry run) counts `UNITS_PER_COPY`. The counts are the same
whichever engine runs the scheduler (`engine`), so a cap in units stops the same runs, and gives
the same placements, on any machine and with either engine; seconds would not.

`metered(cap)` caps the runs of `run_scheduler.run_list_scheduler` made in its body (m-ETF's,
m-SCT's and the simulator's): a run that would take the body's work past `cap` raises
`OverWorkCap`, as soon as a check sees it (the engines check at different steps, but a run is
stopped exactly when its whole work would pass the cap, so what is stopped is the same).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Iterator, Optional

__all__ = ["UNITS_PER_COPY", "OverWorkCap", "WorkMeter", "metered", "scheduler_work"]

# Units of work per copy given a slot: on layered graphs, whose ops mostly read from other
# devices, copies cost about as much as 1.5 dry runs each.
UNITS_PER_COPY = 1.5


class OverWorkCap(Exception):
    """The runs made under a `metered` cap would pass it."""

    def __init__(self, cap: float) -> None:
        super().__init__(f"its list-scheduler runs would take more than {cap:,.0f} units of work")
        self.cap = cap

    def __reduce__(self):  # pickled from a worker process (`workers`)
        return OverWorkCap, (self.cap,)


@dataclasses.dataclass
class WorkMeter:
    """The units of work of the finished runs made under it, against `cap`."""

    cap: float = math.inf
    used: int = 0

    def check(self, running: int) -> None:
        """Raises `OverWorkCap` when `running` more units (a run's so far) pass the cap."""
        if self.used + running > self.cap:
            raise OverWorkCap(self.cap)


_meter: contextvars.ContextVar[Optional[WorkMeter]] = contextvars.ContextVar(
    "baechi_tf_work_meter", default=None
)


@contextlib.contextmanager
def metered(cap: float) -> Iterator[WorkMeter]:
    """Caps the list-scheduler runs of the body at `cap` units in all (see the module)."""
    meter = WorkMeter(cap)
    token = _meter.set(meter)
    try:
        yield meter
    finally:
        _meter.reset(token)


def current_meter() -> Optional[WorkMeter]:
    """The meter of the innermost `metered` body, if any."""
    return _meter.get()


def scheduler_work(scheduler) -> int:
    """The units of `scheduler`'s dry runs and copies so far (a `ListScheduler` or its compiled
    twin): its steps are counted by whoever runs it."""
    return scheduler.evaluations + int(scheduler.state.copy_slots * UNITS_PER_COPY)
