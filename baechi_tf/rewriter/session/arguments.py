"""The arguments of `BaechiSession`: checked, completed with their defaults, and turned into the
devices and session configs that every session it makes uses (`configure`)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import numbers
from typing import Any, Mapping, Optional

from baechi_tf.cluster import DEFAULT_COMM, CommCost
from baechi_tf.cost_model.profile import not_a_profile_to_replace
from baechi_tf.errors import ConfigError
from baechi_tf.placer.pipeline import PlacementOptions
from baechi_tf.rewriter.devices import DeviceSetup, session_config, session_devices, with_fitted_link
from baechi_tf.rewriter.distributed.discovery import discover_devices, is_remote_target, remote_session_config
from baechi_tf.rewriter.distributed.spec import parse_cluster_spec

__all__ = ["Settings", "configure"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a `BaechiSession` was given, checked and resolved."""

    graph: Any  # the user's graph (fetches and feeds name its tensors and ops)
    wrapped: Any  # the session it wraps, or None
    options: PlacementOptions
    setup: DeviceSetup  # the placement targets, the host CPU and how sessions are configured
    target: str  # of every session it makes ('' in this process)
    run_config: Any  # a placed session's
    profile_config: Any  # a profiling copy's: the same optimizations, with soft placement
    unfused_config: Any  # a placed session's whose placement splits ops the remapper fused
    warmup_steps: int
    profile_steps: int
    cost_path: Optional[str]
    report_dir: Optional[str]  # reports of each placement (baechi_tf.reports)
    ignore_user_devices: bool  # ops pinned to devices that do not exist are placed as the others
    link_fit: Any = None  # comm='auto': the fit of the link to copies between two devices


def configure(sess: Any, arguments: Mapping[str, Any]) -> Settings:
    """The `Settings` of ``BaechiSession(sess, **arguments)`` (every keyword argument of its
    signature, by name), or a `ConfigError` naming the argument that is wrong and how to give it.
    Finds the devices (on a cluster: asks its tasks)."""
    import tensorflow as tf

    a = argparse.Namespace(**arguments)
    graph, config, target, options, placement_method = a.graph, a.config, a.target, a.options, a.placement_method
    memory_fraction, comm, inter_host_comm = a.memory_fraction, a.comm, a.inter_host_comm
    cost_path, report_dir = a.cost_path, a.report_dir

    if isinstance(sess, tf.Graph):
        raise ConfigError(
            "BaechiSession's first argument is a session to wrap; give a graph as "
            "BaechiSession(graph=...)"
        )
    if sess is not None and not isinstance(getattr(sess, "graph", None), tf.Graph):
        raise ConfigError(
            f"BaechiSession's first argument is a {type(sess).__name__}, not a session; give a "
            "tf.compat.v1.Session to wrap, or graph=..."
        )
    if sess is not None:
        if graph is not None and graph is not sess.graph:
            raise ConfigError("graph= differs from the graph of the session given; give one")
        if config is not None:
            raise ConfigError(
                "config= is for BaechiSession(graph=..., config=...); the session given "
                "already has its config"
            )
        graph = sess.graph
        config = getattr(sess, "_config", None)
        wrapped_target = getattr(sess, "sess_str", "") or ""  # bytes in TF's Session
        if isinstance(wrapped_target, bytes):
            wrapped_target = wrapped_target.decode()
        target = target or wrapped_target
    elif graph is None:
        graph = tf.compat.v1.get_default_graph()
    # NumPy's integers (a sweep over np.arange) count as the ints they are.
    num_devices, memory_bytes_per_device, warmup_steps, profile_steps = (
        _whole(v) for v in (a.num_devices, a.memory_bytes_per_device, a.warmup_steps, a.profile_steps)
    )
    _check_types(options, comm, inter_host_comm, warmup_steps, profile_steps, memory_bytes_per_device, memory_fraction)
    if options is None:
        options = (
            PlacementOptions()
            if placement_method is None
            else PlacementOptions(placement_method=placement_method)
        )
    elif placement_method is not None and placement_method != options.placement_method:
        raise ConfigError(
            f"placement_method={placement_method!r} contradicts the options' "
            f"{options.placement_method!r}; give one of them"
        )
    options.validate()
    if options.placement_method == "expert" and not options.expert:
        # Nothing gives it a layout later (train.py gives its model's): said now, not once the
        # first run has profiled.
        raise ConfigError(
            "placement method 'expert' needs a hand layout and none was given: give "
            "PlacementOptions(expert={op name: device name}), or choose another method"
        )
    if profile_steps < 1 or warmup_steps < 0:
        raise ConfigError(
            f"profile_steps={profile_steps}, warmup_steps={warmup_steps}: trace at least one "
            "step and warm up zero or more"
        )
    auto_comm = isinstance(comm, str)  # 'auto', as _check_types let through
    if auto_comm:
        comm = DEFAULT_COMM
    spec = parse_cluster_spec(a.cluster_spec) if a.cluster_spec is not None else None
    if spec is not None and not target:
        target = spec.target
    remote = is_remote_target(target)
    if remote:
        target = target.rstrip("/")  # 'grpc://host:port/' is no host-port pair to TF
        setup: DeviceSetup = discover_devices(
            target,
            spec=spec,
            num_devices_per_task=num_devices,
            memory_bytes_per_device=memory_bytes_per_device,
            memory_fraction=memory_fraction,
            comm=comm,
            inter_host_comm=inter_host_comm,
            timeout_s=a.connect_timeout_s,
            config=config,
        ).devices
    else:
        if spec is not None:
            raise ConfigError(
                f"cluster_spec= was given with target={target!r}; target the cluster "
                "('grpc://host:port' of one of its tasks) or leave target empty"
            )
        if inter_host_comm is not None:  # it was dropped without a word
            log.warning(
                "inter_host_comm= is not used: every device is on this host (give "
                "cluster_spec= or a 'grpc://host:port' target to place across hosts)"
            )
        if num_devices is None:
            num_devices = max(1, len(tf.config.list_physical_devices("GPU")))
        setup = session_devices(
            num_devices,
            memory_bytes_per_device=memory_bytes_per_device,
            memory_fraction=memory_fraction,
            comm=comm,
            config=config,
        )
    # comm='auto': the link fitted to copies between two of the devices, before anything runs.
    link_fit = None
    if auto_comm:
        bench_config = session_config(setup, config, grappler=False)
        setup, link_fit = with_fitted_link(
            setup, remote_session_config(bench_config) if remote else bench_config,
            target if remote else "", flag="comm='auto'")
        if link_fit is not None:
            log.info("%s", link_fit.describe())
    # The profile is taken with the optimizations the placed graph runs with.
    run_config = session_config(setup, config, grappler=a.grappler)
    profile_config = session_config(setup, config, grappler=a.grappler)
    profile_config.allow_soft_placement = True
    # For a placement that splits ops the remapper fused while profiling (`placed.split_fusion`).
    unfused_config = session_config(setup, config, grappler=a.grappler, remapping=False)
    if remote:  # profiling and placed sessions must not share variables on the servers
        run_config = remote_session_config(run_config)
        profile_config = remote_session_config(profile_config)
        unfused_config = remote_session_config(unfused_config)
    _check_outputs(cost_path, report_dir)
    return Settings(
        graph=graph,
        wrapped=sess,
        options=options,
        setup=setup,
        target=target,
        run_config=run_config,
        profile_config=profile_config,
        unfused_config=unfused_config,
        warmup_steps=warmup_steps,
        profile_steps=profile_steps,
        cost_path=cost_path,
        report_dir=report_dir,
        # Place ops pinned to devices that do not exist, too: as asked, or as TF's soft placement
        # does (a Session of that config runs them elsewhere).
        ignore_user_devices=a.ignore_user_devices or bool(config is not None and config.allow_soft_placement),
        link_fit=link_fit,
    )


def _check_types(
    options: Any, comm: Any, inter_host_comm: Any, warmup_steps: Any, profile_steps: Any,
    memory_bytes_per_device: Any, memory_fraction: Any,
) -> None:
    """`ConfigError` for arguments of the wrong type, which would otherwise fail only at the first
    run, with an error that does not name them."""
    if options is not None and not isinstance(options, PlacementOptions):
        raise ConfigError(
            f"options={options!r} is a {type(options).__name__}; give a PlacementOptions "
            "(PlacementOptions(placement_method='m_etf', ...))"
        )
    for name, value in (("comm", comm), ("inter_host_comm", inter_host_comm)):
        if name == "comm" and isinstance(value, str) and value.strip().lower() == "auto":
            continue
        if value is not None and not isinstance(value, CommCost):
            raise ConfigError(
                f"{name}={value!r} is a {type(value).__name__}; give a CommCost "
                "(CommCost(slope_us_per_byte=..., intercept_us=...))"
                + (", or comm='auto' to fit it to copies between the devices" if name == "comm" else "")
            )
    for name, value in (("warmup_steps", warmup_steps), ("profile_steps", profile_steps)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}={value!r} is not a whole number of steps")
    # A string ('8GiB') or None failed with a TypeError that did not name them.
    memory = memory_bytes_per_device
    if isinstance(memory, bool) or not isinstance(memory, (int, float)) or (
        isinstance(memory, float) and not memory.is_integer()
    ):
        raise ConfigError(
            f"memory_bytes_per_device={memory!r} is not a whole number of bytes; give bytes, "
            "e.g. 8 << 30 for 8 GiB"
        )
    if isinstance(memory_fraction, bool) or not isinstance(memory_fraction, numbers.Real):
        raise ConfigError(f"memory_fraction={memory_fraction!r} is not a number; give one in (0, 1]")


def _whole(value: Any) -> Any:
    """`value` as an int when it is an integer of another type (NumPy's), else as it is."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        return int(value)
    return value


def _check_outputs(cost_path: Optional[str], report_dir: Optional[str]) -> None:
    """`ConfigError` for a `cost_path` or `report_dir` that cannot be written, or would write
    over the other or a file of the user's, before any work."""
    from baechi_tf._files import check_apart, check_report_folder, check_writable

    if cost_path:
        check_writable(cost_path, "cost_path")
        why = not_a_profile_to_replace(cost_path)
        if why:  # a typo naming a source file was written over without a word
            raise ConfigError(
                f"cost_path {cost_path!r} is a file that is not a cost profile ({why}), and "
                "the profile would be written over it; give another path, or remove the file first"
            )
    if report_dir:
        if cost_path:
            check_apart(report_dir, "report_dir", cost_path, "cost_path")
        check_report_folder(report_dir, "report_dir", keep=(cost_path or "",))
