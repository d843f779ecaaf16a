"""``summary.json`` of the reports: the figures of a placement as plain JSON values."""

from __future__ import annotations

from typing import Any, Optional, Sequence

__all__ = ["summary"]


def summary(result: Any, critical: Optional[Sequence[int]] = None) -> dict[str, Any]:
    """The figures of a placement as plain JSON values.

    Keys: method, num_ops, num_groups, makespan_us, lower_bound_us, makespan_over_lower_bound,
    single_device_makespan_us (None when the graph does not fit one device), placement_seconds,
    step_seconds, memory_fraction (the share of each device's memory the placer could fill,
    ``--placer_memory_fraction``), devices (per device: name, ops, compute_us, peak_memory_bytes,
    reordered_peak_bytes: the peak with ops out of the simulated order (`expected_peaks`),
    capacity_bytes, placer_share_bytes: that share of capacity_bytes), num_transfers,
    transfer_bytes, critical_path (op names, first to last), critical_path_us (compute time of
    its ops), candidates (``auto``: makespan per placer it ran, null for one that failed or that
    auto stopped as too slow to be of use; else None), refinement (``auto``: initial_makespan_us,
    the makespan of the placement it started from, the winner in method, and seconds; None when
    it did not refine).
    """
    graph, cluster, schedule = result.graph, result.cluster, result.schedule
    if critical is None:
        critical = schedule.critical_chain(graph, cluster)[0]
    device_of = result.placement.device_of
    fraction = float(result.memory_fraction)
    shares = cluster.with_memory_fraction(fraction).devices
    devices = []
    for d, dev in enumerate(cluster.devices):
        mask = device_of == d
        devices.append(
            {
                "name": dev.name,
                "ops": int(mask.sum()),
                "compute_us": float(graph.compute_us[mask].sum()),
                "peak_memory_bytes": int(schedule.peak_memory_bytes[d]),
                "reordered_peak_bytes": int(result.reordered_peak_bytes[d]),
                "capacity_bytes": int(dev.memory_bytes),
                "placer_share_bytes": int(shares[d].memory_bytes),
            }
        )
    makespan, bound = float(result.makespan_us), float(result.lower_bound_us)
    single = result.single_device_makespan_us
    return {
        "method": result.placement.method,
        "num_ops": graph.num_ops,
        "num_groups": int(result.groups.num_groups),
        "makespan_us": makespan,
        "lower_bound_us": bound,
        "makespan_over_lower_bound": makespan / bound if bound > 0 else None,
        "single_device_makespan_us": None if single is None else float(single),
        "placement_seconds": float(result.placement_seconds),
        "step_seconds": {k: float(v) for k, v in result.step_seconds.items()},
        "memory_fraction": fraction,
        "devices": devices,
        "num_transfers": len(schedule.transfers),
        "transfer_bytes": int(sum(int(graph.tensor_bytes[t.tensor]) for t in schedule.transfers)),
        "critical_path": [graph.names[op] for op in critical],
        "critical_path_us": float(sum(float(graph.compute_us[op]) for op in critical)),
        "candidates": _candidates(result),
        "refinement": _refinement(result),
    }


def _refinement(result: Any) -> Optional[dict[str, float]]:
    stats = getattr(result, "refine_stats", None)
    if stats is None:
        return None
    return {"initial_makespan_us": float(stats.initial_makespan_us), "seconds": float(stats.seconds)}


def _candidates(result: Any) -> Optional[dict[str, Optional[float]]]:
    """``auto``: the simulated makespan of each placer it ran (None where one failed)."""
    found = getattr(result, "candidates", None)
    if not found:
        return None
    return {k: None if v is None else float(v) for k, v in sorted(found.items())}
