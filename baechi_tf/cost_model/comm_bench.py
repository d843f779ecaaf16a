"""Timing copies between two devices, and ``--comm_cost_coeffs=auto``: the line fitted to them.

`measure_transfer_us` times a float32 ``[n, 1]`` tensor sent from one device to another in a
fresh graph: ``from_op = matmul(variable[n, 1], variable[1, 1])`` on the source, ``to_op =
matmul(from_op, variable[1, 1])`` on the destination, each run traced (FULL_TRACE); the time is
the gap from the end of ``from_op`` to the start of ``to_op`` (Send/Recv and scheduling
included, as in Baechi's benchmark, SoCC 2020), or, across hosts whose clocks differ, half a
round trip timed on the source's clock. `utils/communication_benchmark.py` is its command line.

`measure_in_flight_us` times copies sent together: one op on the source splits a variable into N
tensors, one op on the destination adds them up, and the time is again from the producer's end to
the consumer's start; `measure_in_flight` fits the link's `CommCost.copies_in_flight` to it
(`comm_fit.fit_copies_in_flight`).

`auto_comm` is what ``--comm_cost_coeffs=auto`` runs before placing: copies of 2^0 ..
2^(AUTO_EXPONENT-1) elements between the first two devices of the cluster that would be placed
on, a few runs each, and `comm_fit.fit_comm_cost`'s line through them. Between two CPU stand-ins
of one process a "copy" is TF's local rendezvous, which hands the reader the sender's buffer: the
line is then a few microseconds and almost flat, the cost of a hand-over, not of a bus. Between
CPU devices of two worker tasks, where gRPC overlaps copies, it also fits the copies in flight.

Cost: one graph and session per size and pair, ``warmup + runs`` steps each; about a second or
two for `auto_comm` on CPU stand-ins.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from baechi_tf import interrupts
from baechi_tf.cost_model.comm_fit import CommFit, InFlightFit, fit_comm_cost, fit_copies_in_flight

__all__ = [
    "AUTO_EXPONENT", "IN_FLIGHT_COUNTS", "AutoComm", "auto_comm", "measure_in_flight",
    "measure_in_flight_us", "measure_line", "measure_transfer_us", "round_trip_transfer_us",
    "transfer_gap_us",
]

AUTO_EXPONENT = 20  # sizes 2^0 .. 2^19 float32 elements: up to 2 MiB
IN_FLIGHT_COUNTS = (1, 2, 4, 8, 16, 32)  # copies sent together, for `measure_in_flight`
_AUTO_RUNS, _AUTO_WARMUP = 3, 1


def _event_times_ns(step_stats, name: str) -> list[tuple[int, int]]:
    """(start, end) in ns of every step-stats record of the op `name`."""
    out = []
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            if ns.node_name != name:
                continue
            if ns.all_start_nanos:
                out.append((ns.all_start_nanos, ns.all_start_nanos + ns.all_end_rel_nanos))
            else:
                start = ns.all_start_micros * 1000
                out.append((start, start + ns.all_end_rel_micros * 1000))
    return out


def transfer_gap_us(step_stats) -> float:
    """Earliest start of ``to_op`` minus latest end of ``from_op``, in microseconds."""
    ends = [end for _, end in _event_times_ns(step_stats, "from_op")]
    starts = [start for start, _ in _event_times_ns(step_stats, "to_op")]
    if not ends or not starts:
        raise RuntimeError("the trace has no record of from_op or to_op")
    return (min(starts) - max(ends)) / 1000.0


def round_trip_transfer_us(step_stats) -> float:
    """Half of ``from_op -> mid_op -> to_op``'s gap less ``mid_op``'s own time, in microseconds.

    ``from_op`` and ``to_op`` run on one host and ``mid_op``'s duration is measured on its own,
    so no difference of two hosts' clocks enters the result.
    """
    mid = _event_times_ns(step_stats, "mid_op")
    if not mid:
        raise RuntimeError("the trace has no record of mid_op")
    return (transfer_gap_us(step_stats) - sum(e - s for s, e in mid) / 1000.0) / 2.0


def measure_transfer_us(
    num_elements: int,
    src: str,
    dst: str,
    config: Any,
    *,
    num_warmup: int,
    num_runs: int,
    target: str = "",
    round_trip: bool = False,
) -> list[float]:
    """Transfer times in us of a float32 [num_elements, 1] tensor from `src` to `dst`.

    With `round_trip`, the tensor goes to `dst` and back (`round_trip_transfer_us`).
    """
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        ones = tf1.ones_initializer()
        with tf.device(src):
            big = tf1.get_variable("from_var", [num_elements, 1], initializer=ones,
                                   use_resource=True)
            w_from = tf1.get_variable("from_w", [1, 1], initializer=ones, use_resource=True)
            from_op = tf.matmul(big, w_from, name="from_op")
        with tf.device(dst):
            w_to = tf1.get_variable("to_w", [1, 1], initializer=ones, use_resource=True)
            to_op = tf.matmul(from_op, w_to, name="mid_op" if round_trip else "to_op").op
        if round_trip:
            with tf.device(src):
                w_back = tf1.get_variable("back_w", [1, 1], initializer=ones, use_resource=True)
                to_op = tf.matmul(to_op.outputs[0], w_back, name="to_op").op
        init = tf1.global_variables_initializer()
    gap = round_trip_transfer_us if round_trip else transfer_gap_us
    return _timed(graph, init, to_op, gap, config, target, num_warmup, num_runs)


def _timed(graph: Any, init: Any, op: Any, gap: Any, config: Any, target: str, num_warmup: int,
           num_runs: int) -> list[float]:
    """`gap` of the step stats of `num_runs` traced runs of `op`, after `init` and `num_warmup`
    untraced runs, in a session of `config` on `target`."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
    times = []
    with tf1.Session(target, graph=graph, config=config) as sess:
        sess.run(init)
        for _ in range(num_warmup):
            sess.run(op)
            interrupts.check()  # a Ctrl-C that TF swallowed still stops the runs
        for _ in range(num_runs):
            metadata = tf1.RunMetadata()
            sess.run(op, options=options, run_metadata=metadata)
            interrupts.check()
            times.append(gap(metadata.step_stats))
    return times


def measure_in_flight_us(num_copies: int, src: str, dst: str, config: Any, *, num_warmup: int,
                         num_runs: int, target: str = "") -> list[float]:
    """Times in us from the end of ``from_op`` (a Split of a float32 variable into `num_copies`
    one-element tensors, on `src`) to the start of ``to_op`` (an AddN of them all, on `dst`):
    the copies are ready at once, and the last one in starts the consumer."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        ones = tf1.ones_initializer()
        with tf.device(src):
            var = tf1.get_variable("from_var", [num_copies, 1], initializer=ones, use_resource=True)
            parts = tf.raw_ops.Split(axis=0, value=var.read_value(), num_split=num_copies, name="from_op")
        with tf.device(dst):
            bias = tf1.get_variable("to_w", [1, 1], initializer=ones, use_resource=True)
            to_op = tf.raw_ops.AddN(inputs=[*parts, bias.read_value()], name="to_op").op
        init = tf1.global_variables_initializer()
    return _timed(graph, init, to_op, transfer_gap_us, config, target, num_warmup, num_runs)


def measure_in_flight(comm: Any, src: str, dst: str, config: Any, *, target: str = "",
                      counts: tuple[int, ...] = IN_FLIGHT_COUNTS, runs: int = _AUTO_RUNS,
                      warmup: int = _AUTO_WARMUP) -> InFlightFit:
    """`comm` (the link's line, a `CommCost`) with its copies in flight fitted to
    `measure_in_flight_us` of each of `counts`, `runs` traced runs each after `warmup`
    untimed ones (runs whose consumer started before the producer ended are dropped)."""
    n: list[float] = []
    times_us: list[float] = []
    for count in counts:
        kept = [t for t in measure_in_flight_us(count, src, dst, config, num_warmup=warmup,
                                                num_runs=runs, target=target) if t > 0]
        n += [float(count)] * len(kept)
        times_us += kept
    return fit_copies_in_flight(n, times_us, comm, 4.0)


def measure_line(src: str, dst: str, config: Any, *, target: str = "", exponent: int = AUTO_EXPONENT,
                 runs: int = _AUTO_RUNS, warmup: int = _AUTO_WARMUP, round_trip: bool = False) -> CommFit:
    """The line fitted to copies from `src` to `dst` of 2^0 .. 2^(exponent-1) float32 elements,
    `runs` traced runs each after `warmup` untimed ones (runs whose consumer started before the
    producer ended are dropped)."""
    nbytes: list[float] = []
    times_us: list[float] = []
    for e in range(exponent):
        n = 1 << e
        kept = [t for t in measure_transfer_us(n, src, dst, config, num_warmup=warmup, num_runs=runs,
                                               target=target, round_trip=round_trip) if t > 0]
        nbytes += [4.0 * n] * len(kept)
        times_us += kept
    return fit_comm_cost(nbytes, times_us)


@dataclasses.dataclass(frozen=True)
class AutoComm:
    """What ``--comm_cost_coeffs=auto`` measured: the line, the two devices it was timed
    between, how to read it, and the copies in flight where they were timed."""

    fit: CommFit
    src: str
    dst: str
    note: str  # what the line is a line of ("a copy between two tasks", ...)
    in_flight: Optional[InFlightFit] = None  # between CPU devices of two tasks, else None

    @property
    def comm(self) -> Any:
        """The link to place with: the line, with its copies in flight when they were fitted."""
        return self.in_flight.comm if self.in_flight is not None else self.fit.comm

    def describe(self) -> str:
        c = self.fit.comm
        text = (f"link fitted (--comm_cost_coeffs=auto): {c.slope_us_per_byte:.6g} us/B x + "
                f"{c.intercept_us:.6g} us, {self.src} -> {self.dst}, {self.fit.num_sizes} sizes, "
                f"rms relative error {100 * self.fit.rms_relative_error:.0f}%; {self.note}")
        if self.in_flight is not None:
            text += (f"; {self.in_flight.comm.copies_in_flight:.3g} copies in flight (copies sent "
                     f"together follow each other {self.in_flight.spacing_us:.0f} us apart)")
        return text


def auto_comm(cluster: Any, config: Any, target: str = "", *, exponent: int = AUTO_EXPONENT) -> Optional[AutoComm]:
    """Times copies between the first two devices of `cluster` (a `Cluster` whose devices a
    session of `config` on `target` has) and fits the line; None with one device (no copy to
    time). Devices of two tasks are timed by half round trips (their hosts' clocks may differ);
    when they are CPU devices, which gRPC's copies between tasks overlap, so are copies sent
    together (`measure_in_flight`), and the link gets its `CommCost.copies_in_flight`. The
    session config is used with Grappler off, so that the benchmark's ops stay as built."""
    from baechi_tf.cluster import device_task

    if cluster.num_devices < 2:
        return None
    config = type(config).FromString(config.SerializeToString())
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    src, dst = cluster.names[:2]
    across = device_task(src) != device_task(dst)
    fit = measure_line(src, dst, config, target=target, exponent=exponent, round_trip=across)
    if across:
        note = "half round trips between two tasks"
    elif target or cluster.devices[0].type != "CPU":
        note = "copies within one task"
    else:
        note = ("CPU stand-ins in one process: a copy is a hand-over of the sender's buffer (no "
                "memcpy of the bytes), so the line is far below a GPU link's")
    in_flight = None
    if across and all(d.type == "CPU" for d in cluster.devices[:2]):
        in_flight = measure_in_flight(fit.comm, src, dst, config, target=target)
    return AutoComm(fit, src, dst, note, in_flight)
