"""Text summaries of a placement, for terminals and logs."""

from __future__ import annotations

from baechi_tf.placer.scheduler_state import format_bytes

__all__ = ["counted", "one_device_label", "summary_table"]


def counted(n: int, noun: str) -> str:
    """'1 step', '2 steps': `n` and `noun`, plural unless `n` is 1."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def one_device_label(result) -> str:
    """What the one-device baseline (`single_device_makespan_us`) is: "one device", or, when
    pinned ops keep it on several, "one device + pins (N devices)"."""
    n = result.single_device_count
    return "one device" if n < 2 else f"one device + pins ({n} devices)"


def summary_table(result) -> str:
    """A short table: per device ops, compute, peak memory (and, where it differs, the peak as TF
    may hold the step's memory, `PlacementResult.reordered_peak_bytes`: each device's ops up to
    `memory_timeline.order_windows` places out of the simulated order, copies as TF makes them,
    or on CPU devices of a shared pool of threads TF's executor emulated on it
    (`executor_order.expected_peaks`), so above or below the simulated peak; where the simulation held ops back for memory, the peak
    with none held back, `PlacementResult.unheld_peak_bytes`); then makespan against the bounds."""
    graph, cluster, schedule = result.graph, result.cluster, result.schedule
    device_of = result.placement.device_of
    # With --placer_memory_fraction below 1 the placer filled only its share of each device.
    fraction = result.memory_fraction
    budgets = cluster.with_memory_fraction(fraction).devices if fraction < 1 else ()
    # The peak where TF runs ops out of the simulated order, where that moves it.
    reordered = result.reordered_peak_bytes
    if tuple(reordered) == tuple(schedule.peak_memory_bytes):
        reordered = None
    rows = [("device", "ops", "compute ms", "peak memory") + (("peak, reordered",) if reordered else ())
            + ("capacity",)]
    if budgets:
        rows[0] += (f"placer's share ({fraction:.0%})",)
    # Where ops waited for memory in the simulation: the peak with none held back, as TF runs them.
    unheld = result.unheld_peak_bytes
    if unheld is not None and tuple(unheld) == tuple(schedule.peak_memory_bytes):
        unheld = None
    if unheld is not None:
        rows[0] += ("peak, no op held back",)
    for d, dev in enumerate(cluster.devices):
        mask = device_of == d
        rows.append(
            (
                dev.name,
                str(int(mask.sum())),
                f"{graph.compute_us[mask].sum() / 1e3:.3f}",
                format_bytes(schedule.peak_memory_bytes[d]),
            )
            + ((format_bytes(reordered[d]),) if reordered else ())
            + (format_bytes(dev.memory_bytes),)
            + ((format_bytes(budgets[d].memory_bytes),) if budgets else ())
            + ((format_bytes(unheld[d]),) if unheld is not None else ())
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in rows
    ]
    single = result.single_device_makespan_us
    pairs = [
        ("method", result.placement.method),
        ("ops / groups", f"{graph.num_ops} / {result.groups.num_groups}"),
        ("makespan (simulated)", f"{result.makespan_us / 1e3:.3f} ms"),
        ("lower bound", f"{result.lower_bound_us / 1e3:.3f} ms"
         f"  (makespan / bound = {_ratio(result.makespan_us, result.lower_bound_us)})"),
        (one_device_label(result),
         f"{single / 1e3:.3f} ms  (speed-up {_ratio(single, result.makespan_us)})"
         if single is not None else "does not fit"),
        ("transfers", str(len(schedule.transfers))),
        ("link", _link(cluster)),
        ("placement time", f"{result.placement_seconds:.3f} s"),
    ]
    if result.refine_stats is not None:  # auto's: the method names where refinement started
        pairs.insert(3, ("refinement", _refinement(result.refine_stats)))
    width = max(22, max(len(label) for label, _ in pairs))  # "one device + pins (N devices)" is longer
    lines += [""] + [f"{label:<{width}} {value}" for label, value in pairs]
    return "\n".join(lines)


def _refinement(stats) -> str:
    """'13.102 -> 12.784 ms (-2.4%) in 3.0 s', or 'no gain in 3.0 s'."""
    before, after = stats.initial_makespan_us, stats.final_makespan_us
    if not after < before:
        return f"no gain in {stats.seconds:.1f} s"
    return f"{before / 1e3:.3f} -> {after / 1e3:.3f} ms ({100 * (after / before - 1):+.1f}%) in {stats.seconds:.1f} s"


def _link(cluster) -> str:
    """'0.0001754 us/B x + 134 us', and the line between tasks when there is one."""
    def line(c) -> str:
        return f"{c.slope_us_per_byte:.4g} us/B x + {c.intercept_us:.4g} us"

    text = line(cluster.comm)
    if cluster.inter_task_comm is not None:
        text += f"; between tasks {line(cluster.inter_task_comm)}"
    if any(cluster.sends_on_compute()):
        text += "; copies wait until their sender runs no op"
    return text


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"
