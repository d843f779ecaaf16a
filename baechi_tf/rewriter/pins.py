"""The devices a GraphDef's nodes, and its functions' nodes, are pinned to, resolved against a
cluster: a device of the cluster, the stand-in a `device_aliases` entry names, the host CPU, or
nothing (a job or task only, or a pin ignored with `ignore_user_devices`). A pin to a device that
is none of these is a `ConfigError` that names the op and the fix.

`import_graph_def` pins its ops with `_DeviceResolver`; `resolve_user_devices` and
`resolve_function_devices` write the resolved pins into a copy TF can run on the cluster. Time
O(nodes + function nodes); TensorFlow's ``DeviceSpec`` parses the names.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from baechi_tf.cluster import Cluster, Device
from baechi_tf.errors import ConfigError

__all__ = ["resolve_function_devices", "resolve_user_devices"]


class _DeviceResolver:
    """Maps a node's ``device`` field to a cluster device name, the host CPU, or nothing."""

    def __init__(
        self,
        cluster: Cluster,
        host: Optional[Device],
        aliases: Mapping[str, str],
        ignore_user_devices: bool,
    ) -> None:
        self.cluster = cluster
        self.host = host
        self.host_cluster = Cluster((host,)) if host is not None else None
        self.aliases = {self._local(k) or k: v for k, v in aliases.items()}
        self._alias_specs = {k: self._spec(v) for k, v in self.aliases.items()}  # parsed once
        self.ignore = ignore_user_devices
        self.ignored: list[str] = []

    @staticmethod
    def _spec(text: str):
        import tensorflow as tf

        try:
            return tf.DeviceSpec.from_string(text)
        except (ValueError, TypeError):
            return None

    @classmethod
    def _local(cls, text: str) -> Optional[str]:
        spec = cls._spec(text)
        if spec is None or spec.device_type is None or spec.device_index is None:
            return None
        return f"device:{spec.device_type.upper()}:{spec.device_index}"

    def resolve(self, op_name: str, text: str, function: Optional[str] = None) -> tuple[Optional[str], bool]:
        """(device name or None, whether it is the host CPU); `function` names the library
        function whose node `op_name` is, if it is one."""
        if not text:
            return None, False
        what = f"op {op_name!r}" + (f" of function {function!r}" if function else "")
        spec = self._spec(text)
        if spec is None:
            raise ConfigError(f"{what} has the malformed device {text!r}")
        if spec.device_type is None or spec.device_index is None:
            return None, False  # a job or task only: no single device
        local = f"device:{spec.device_type.upper()}:{spec.device_index}"
        if local in self.aliases and self._same_task(spec, self._alias_specs[local]):
            return self.aliases[local], False
        i = self.cluster.find(text)
        if i is not None:
            return self.cluster.names[i], False
        if self.host_cluster is not None and self.host_cluster.find(text) is not None:
            return self.host.name, True  # type: ignore[union-attr]
        if self.ignore:
            self.ignored.append(op_name)
            return None, False
        raise ConfigError(
            f"{what} is pinned to {text!r}, which is not one of the devices "
            f"({', '.join(self.cluster.names)}); give a device of that name (more devices, if "
            "its index is past theirs), or ignore the pins the graph carries "
            "(ignore_user_devices=True, --ignore_user_devices)"
        )

    @staticmethod
    def _same_task(spec, own) -> bool:
        """Whether the job, replica and task that `spec` names, if any, are those of `own`, the
        stand-in's parsed name (a GPU of this process written in full,
        ``/job:localhost/replica:0/task:0/device:GPU:0``)."""
        return own is not None and all(
            mine is None or mine == theirs
            for mine, theirs in ((spec.job, own.job), (spec.replica, own.replica), (spec.task, own.task))
        )


def resolve_user_devices(
    graph_def: Any,
    cluster: Cluster,
    *,
    host_device: Optional[Device] = None,
    device_aliases: Optional[Mapping[str, str]] = None,
    ignore_user_devices: bool = False,
) -> Any:
    """A copy of `graph_def` whose device fields name the devices `import_graph_def` pins the
    nodes to (a stand-in for a GPU, the host), and are empty where it pins nothing (a job or task
    only, a device ignored with `ignore_user_devices`): a copy TF can run on `cluster`, as a
    profiling copy must. `ConfigError` for a pin to a device that is not there, as the import's.
    """
    return _resolved_copy(graph_def, cluster, host_device, device_aliases, ignore_user_devices, nodes=True)


def resolve_function_devices(
    graph_def: Any,
    cluster: Cluster,
    *,
    host_device: Optional[Device] = None,
    device_aliases: Optional[Mapping[str, str]] = None,
    ignore_user_devices: bool = False,
) -> Any:
    """A copy of `graph_def` whose functions' nodes name the devices their pins resolve to, as
    `resolve_user_devices` does for the graph's nodes (the graph's nodes are left as they are):
    the body of a v2 loop or cond built under ``tf.device('/GPU:0')`` runs on the stand-in for
    that GPU, as the loop does. `ConfigError` for a pin to a device that is not there."""
    return _resolved_copy(graph_def, cluster, host_device, device_aliases, ignore_user_devices, nodes=False)


def _resolved_copy(
    graph_def: Any,
    cluster: Cluster,
    host_device: Optional[Device],
    device_aliases: Optional[Mapping[str, str]],
    ignore_user_devices: bool,
    *,
    nodes: bool,
) -> Any:
    """A copy of `graph_def` with its functions' pins resolved, and its nodes' with `nodes`."""
    resolver = _DeviceResolver(cluster, host_device, device_aliases or {}, ignore_user_devices)
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    if nodes:
        for node in out.node:
            if node.device:
                node.device = resolver.resolve(node.name, node.device)[0] or ""
    _resolve_function_devices(out, resolver)
    return out


def _resolve_function_devices(graph_def: Any, resolver: "_DeviceResolver", *, write: bool = True) -> None:
    """Resolves the device of each node of `graph_def`'s functions in place (a copy's); without
    `write`, only raises `ConfigError` for a pin to a device that is not there (as for the graph's
    nodes), before any placement is made."""
    for fdef in graph_def.library.function:
        for node in fdef.node_def:
            if node.device:
                device = resolver.resolve(node.name, node.device, fdef.signature.name)[0]
                if write:
                    node.device = device or ""
