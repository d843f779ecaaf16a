"""What chooses among the list scheduler's ready ops: the `Policy` interface, m-ETF's
`EarliestStartPolicy` and the simulator's `FixedPolicy`, and `ScheduleCutOff`, raised when a
schedule passes its cut-off."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

from baechi_tf.placer.scheduler_state import SchedulerState

__all__ = ["EarliestStartPolicy", "FixedPolicy", "Policy", "ScheduleCutOff"]


class Policy:
    """Which devices an op may take, and whether a device is held back at a time.

    Subclasses override `devices` and optionally `hold` and `committed`.
    """

    # Whether `devices` and `hold` treat untouched twins alike (`Cluster.twins`): then the
    # scheduler weighs one of each set of them (`SchedulerState.distinct`).
    twins_alike = False

    def devices(self, op: int, state: "SchedulerState") -> Iterable[int]:
        """The devices `op` may go to; by default every one of `SchedulerState.distinct`."""
        return state.distinct

    def hold(self, op: int, device: int, start: float, state: "SchedulerState") -> float:
        """The earliest time `op` may start on `device`, given its earliest feasible `start`.

        Must not decrease as the schedule grows (a held device can only be released later).
        """
        return start

    def hold_floor(self, device: int, state: "SchedulerState") -> Optional[tuple[float, int]]:
        """(floor, exempt) while `device` holds ops back: no op whose group is on no device,
        `exempt` aside, starts on `device` before `floor`, which does not decrease until
        `committed` releases the ops held there. None when there is no such bound. Ops held to
        the floor wait in one pool per device (`TailQueue`) with one heap entry."""
        return None

    def committed(
        self, op: int, device: int, state: "SchedulerState"
    ) -> Optional[Iterable[tuple[int, int]]]:
        """Called after `op` was scheduled on `device`.

        May return (op, device) pairs whose hold was lifted: the scheduler looks at them again.
        """
        return None


class EarliestStartPolicy(Policy):
    """m-ETF: any device, earliest start first."""

    twins_alike = True


class FixedPolicy(Policy):
    """The simulator: every op on the device the placement gives it."""

    def __init__(self, device_of: Sequence[int]) -> None:
        self.device_of = [int(d) for d in device_of]

    def devices(self, op: int, state: "SchedulerState") -> Iterable[int]:
        return (self.device_of[op],)


class ScheduleCutOff(Exception):
    """A run's next op would start after the run's `cutoff_us`: whatever it could still
    schedule ends later. `place_auto` stops placements that can no longer be of use this way."""

    def __init__(self, start_us: float, cutoff_us: float) -> None:
        super().__init__(f"an op would start at {start_us:.1f} us, after the cutoff {cutoff_us:.1f} us")
        self.start_us = start_us
        self.cutoff_us = cutoff_us

    def __reduce__(self):  # pickled from a worker process (`workers`)
        return ScheduleCutOff, (self.start_us, self.cutoff_us)
