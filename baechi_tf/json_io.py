"""Op graphs and placements as JSON, so that profiles from any framework can be placed.

Input (see the README)::

    {"devices": [{"name": "/device:GPU:0", "memory_bytes": 8589934592}, ...],
     "comm": {"slope_us_per_byte": 0.0001754, "intercept_us": 134},
     "ops": [{"name": "a", "compute_us": 12.5, "output_bytes": [4096], "temp_bytes": 0,
              "persistent_bytes": 0, "colocation_group": "g1", "device": "/device:GPU:1"}],
     "edges": [{"src": "a", "dst": "b", "src_output": 0}, {"src": "a", "dst": "c", "control": true}]}

``comm``, ``temp_bytes``, ``persistent_bytes``, ``colocation_group``, ``device``, ``src_output``
and ``control`` are optional; so are ``inter_host_comm`` (the link between tasks) and a link's
``copies_in_flight`` (`CommCost.copies_in_flight`: a number >= 1, default 1, or ``"unlimited"``).
Every problem is a `BaechiError` whose message names the field.
"""

from __future__ import annotations

import collections
import json
import math
import os
import sys
from typing import Any, Mapping

from baechi_tf.cluster import Cluster, CommCost, Device
from baechi_tf.errors import BaechiError, ConfigError, InvalidGraphError
from baechi_tf.graph import OpGraph
from baechi_tf.graph_builder import OpGraphBuilder

__all__ = ["graph_to_json", "load_graph_json", "parse_graph_json", "result_to_json"]

_OP_KEYS = {
    "name", "compute_us", "output_bytes", "temp_bytes", "persistent_bytes", "colocation_group",
    "device", "type",
}
_EDGE_KEYS = {"src", "dst", "src_output", "control"}
_DEVICE_KEYS = {"name", "memory_bytes", "type"}
_TOP_KEYS = {"devices", "comm", "inter_host_comm", "ops", "edges"}
_UNLIMITED = "unlimited"  # a link's copies_in_flight without bound (math.inf)


def load_graph_json(path: str) -> tuple[OpGraph, Cluster]:
    """Reads a graph file; raises `BaechiError` naming the file and the problem."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise BaechiError(f"cannot read {path!r}: {e.strerror}") from None
    try:
        # utf-8-sig: a byte order mark, which some editors write, is no error
        doc = json.loads(raw.decode("utf-8-sig"), parse_constant=_reject_constant, parse_int=_parse_int,
                         object_pairs_hook=_Object.of)
    except UnicodeDecodeError:
        raise InvalidGraphError(f"{path!r} is not UTF-8 text; give a JSON graph file") from None
    except json.JSONDecodeError as e:
        raise InvalidGraphError(
            f"{path!r} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    except ValueError as e:
        raise InvalidGraphError(f"{path!r}: {e}") from None
    except RecursionError:
        # json's decoder recurses per nesting level: thousands of '[' exhaust the stack.
        raise InvalidGraphError(
            f"{path!r} nests arrays or objects too deeply to be a graph file; give a JSON graph "
            "file (devices, ops, edges)"
        ) from None
    try:
        return parse_graph_json(doc)
    except BaechiError as e:
        raise type(e)(f"{os.path.basename(path)}: {e}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows; costs must be finite numbers")


class _Object(dict):
    """A JSON object that remembers the keys it was given more than once: json.loads keeps the
    last silently, so a second "edges" array dropped the first one's edges without a word."""

    repeated: tuple[str, ...] = ()

    @classmethod
    def of(cls, pairs: list[tuple[str, Any]]) -> "_Object":
        obj = cls(pairs)
        if len(obj) < len(pairs):
            counts = collections.Counter(k for k, _ in pairs)
            obj.repeated = tuple(sorted(k for k, n in counts.items() if n > 1))
        return obj


class _LongInteger:
    """A JSON integer of more digits than Python converts (`sys.get_int_max_str_digits()`, 4300):
    json.loads raised 'use sys.set_int_max_str_digits() to increase the limit', naming no field.
    Kept as its length, it is refused where its field is read."""

    __slots__ = ("digits",)

    def __init__(self, digits: int):
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _parse_int(text: str) -> Any:
    try:
        return int(text)
    except ValueError:  # too many digits to convert
        return _LongInteger(len(text.lstrip("-")))


def _field(obj: Mapping[str, Any], key: str, where: str, kinds: tuple, required: bool = True, default=None):
    if key not in obj:
        if required:
            raise InvalidGraphError(f"{where} has no {key!r}; add it")
        return default
    value = obj[key]
    if isinstance(value, _LongInteger) and int in kinds:
        raise InvalidGraphError(
            f"{where} has {key}={value!r}, larger than any time or size can be; give microseconds "
            "and bytes"
        )
    if isinstance(value, bool) and bool not in kinds:
        raise InvalidGraphError(f"{where} has {key}={value!r}; expected {_kind_names(kinds)}")
    if not isinstance(value, kinds):
        raise InvalidGraphError(f"{where} has {key}={value!r}; expected {_kind_names(kinds)}")
    if isinstance(value, str) and not _is_utf8(value):
        # JSON's \ud800 escapes a lone half of a UTF-16 pair: no character, which neither the
        # reports' text nor a UTF-8 file can hold (a traceback once --out was written).
        raise InvalidGraphError(
            f"{where} has {key}={value!r}, which holds a lone UTF-16 surrogate (a \\ud800 to "
            "\\udfff escape without its pair), no character; fix the text"
        )
    return value


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _kind_names(kinds: tuple) -> str:
    names = {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object", bool: "true or false"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


_MAX_FLOAT_INT = int(sys.float_info.max)  # the largest integer a float can hold


def _number(obj: Mapping[str, Any], key: str, where: str, required: bool = True, default=0):
    value = _field(obj, key, where, (int, float), required, default)
    if isinstance(value, int) and abs(value) > _MAX_FLOAT_INT:
        # JSON's integers have no limit; math.isfinite and float() of one this long raise
        # OverflowError (a traceback, not a line naming the field).
        raise InvalidGraphError(
            f"{where} has {key}=<an integer of {len(str(abs(value)))} digits>, larger than any time "
            "or size can be; give microseconds and bytes"
        )
    if not math.isfinite(value) or value < 0:
        raise InvalidGraphError(f"{where} has {key}={value!r}; it must be a finite number >= 0")
    return value


def _bytes(obj: Mapping[str, Any], key: str, where: str, required: bool = False) -> int:
    value = _number(obj, key, where, required, 0)
    # Only a float can be fractional; float() of a large int rounds (2**63 - 1 is whole).
    if isinstance(value, float) and not value.is_integer():
        raise InvalidGraphError(f"{where} has {key}={value!r}; give a whole number of bytes")
    if isinstance(value, float) and value >= 2**63:
        # int(1e300) is a 301-digit integer, which the message of the check downstream printed.
        raise InvalidGraphError(
            f"{where} has {key}={value!r}, more bytes than any device can hold (2**63 - 1 at "
            "most); give a size in bytes"
        )
    return int(value)


def _unknown(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    repeated = getattr(obj, "repeated", ())
    if repeated:
        raise InvalidGraphError(
            f"{where} has {', '.join(map(repr, repeated))} more than once (JSON keeps only the "
            "last); keep one"
        )
    extra = sorted(set(obj) - allowed)
    if extra:
        raise InvalidGraphError(
            f"{where} has unknown field(s) {', '.join(map(repr, extra))}; allowed: "
            f"{', '.join(sorted(allowed))}"
        )


def parse_graph_json(doc: Any) -> tuple[OpGraph, Cluster]:
    """Builds the graph and cluster of a parsed JSON document."""
    if not isinstance(doc, dict):
        raise InvalidGraphError("the top level must be an object with 'devices', 'ops' and 'edges'")
    _unknown(doc, _TOP_KEYS, "the graph")
    cluster = _parse_cluster(doc)
    builder = OpGraphBuilder()
    ops = _field(doc, "ops", "the graph", (list,))
    for i, op in enumerate(ops):
        where = f"ops[{i}]"
        if not isinstance(op, dict):
            raise InvalidGraphError(f"{where} is not an object")
        _unknown(op, _OP_KEYS, where)
        name = _field(op, "name", where, (str,))
        if not name:
            raise InvalidGraphError(f"{where} has an empty name")
        where = f"op {name!r}"
        outputs = _field(op, "output_bytes", where, (list,), required=False, default=[])
        out_bytes = [_bytes({"output_bytes": b}, "output_bytes", where, True) for b in outputs]
        group = _field(op, "colocation_group", where, (str,), required=False)
        device = _field(op, "device", where, (str,), required=False)
        builder.add_op(
            name,
            compute_us=float(_number(op, "compute_us", where)),
            output_bytes=out_bytes,
            temp_bytes=_bytes(op, "temp_bytes", where),
            persistent_bytes=_bytes(op, "persistent_bytes", where),
            device=device,
            colocation=(group,) if group else (),
            op_type=_field(op, "type", where, (str,), required=False, default=""),
        )
    edges = _field(doc, "edges", "the graph", (list,), required=False, default=[])
    for i, edge in enumerate(edges):
        where = f"edges[{i}]"
        if not isinstance(edge, dict):
            raise InvalidGraphError(f"{where} is not an object")
        _unknown(edge, _EDGE_KEYS, where)
        src = _field(edge, "src", where, (str,))
        dst = _field(edge, "dst", where, (str,))
        if _field(edge, "control", where, (bool,), required=False, default=False):
            if "src_output" in edge:
                raise InvalidGraphError(f"{where} is a control edge and cannot have 'src_output'")
            builder.add_control_edge(src, dst)
        else:
            out = _field(edge, "src_output", where, (int,), required=False, default=0)
            builder.add_edge(src, dst, out)
    graph = builder.build()
    for op, name in enumerate(graph.pinned_device):
        if name is not None and cluster.find(name) is None:
            raise ConfigError(
                f"op {graph.names[op]!r} is pinned to {name!r}, "
                + (cluster.ambiguity(name) or f"which is not among the devices ({', '.join(cluster.names)}): "
                   "fix the op's 'device' or add the device")
            )
    return graph, cluster


def _parse_cluster(doc: Mapping[str, Any]) -> Cluster:
    devices_doc = _field(doc, "devices", "the graph", (list,))
    if not devices_doc:
        raise ConfigError("'devices' is empty; list at least one device")
    devices = []
    for i, d in enumerate(devices_doc):
        where = f"devices[{i}]"
        if not isinstance(d, dict):
            raise ConfigError(f"{where} is not an object")
        _unknown(d, _DEVICE_KEYS, where)
        name = _field(d, "name", where, (str,))
        memory = _bytes(d, "memory_bytes", where, required=True)
        dtype = _field(d, "type", where, (str,), required=False, default=None)
        if dtype is None:
            dtype = "CPU" if "CPU" in name.upper().rsplit("/", 1)[-1] else "GPU"
        devices.append(Device(name, memory, dtype))
    return Cluster(tuple(devices), _parse_comm(doc, "comm") or CommCost(), _parse_comm(doc, "inter_host_comm"))


def _parse_comm(doc: Mapping[str, Any], key: str):
    comm = _field(doc, key, "the graph", (dict,), required=False)
    if comm is None:
        return None
    _unknown(comm, {"slope_us_per_byte", "intercept_us", "copies_in_flight"}, f"'{key}'")
    k = comm.get("copies_in_flight", 1)
    if k != _UNLIMITED and (isinstance(k, bool) or not isinstance(k, (int, float)) or not k >= 1):
        raise InvalidGraphError(
            f"'{key}' has copies_in_flight={k!r}; give a number >= 1 (1: one copy at a time) or "
            f"{_UNLIMITED!r}"
        )
    return CommCost(
        float(_number(comm, "slope_us_per_byte", f"'{key}'")),
        float(_number(comm, "intercept_us", f"'{key}'")),
        math.inf if k == _UNLIMITED else float(k),
    )


def result_to_json(result) -> dict:
    """The output document of ``place-json`` for a `PlacementResult`."""
    names = result.cluster.names
    return {
        "placement_method": result.placement.method,
        "placement": result.op_to_device(),
        "makespan_us": result.makespan_us,
        "single_device_makespan_us": result.single_device_makespan_us,
        "lower_bound_us": result.lower_bound_us,
        "peak_memory_bytes": dict(zip(names, result.schedule.peak_memory_bytes)),
        "reordered_peak_bytes": dict(zip(names, result.reordered_peak_bytes)),
        "placement_seconds": result.placement_seconds,
    }


def graph_to_json(graph: OpGraph, cluster: Cluster) -> dict:
    """The input document of ``place-json`` for `graph` on `cluster` (inverse of
    `parse_graph_json`; an op with several TF colocation names keeps the first)."""

    def comm(c: CommCost) -> dict:
        out = {"slope_us_per_byte": c.slope_us_per_byte, "intercept_us": c.intercept_us}
        k = c.copies_in_flight
        if k != 1:  # written only then, so documents of the default stay as they were
            out["copies_in_flight"] = _UNLIMITED if k == math.inf else k
        return out

    doc: dict = {
        "devices": [{"name": d.name, "memory_bytes": d.memory_bytes, "type": d.type} for d in cluster.devices],
        "comm": comm(cluster.comm),
    }
    if cluster.inter_task_comm is not None:
        doc["inter_host_comm"] = comm(cluster.inter_task_comm)
    ops = []
    for i, name in enumerate(graph.names):
        op: dict = {
            "name": name,
            "compute_us": float(graph.compute_us[i]),
            "output_bytes": list(graph.output_bytes[i]),
        }
        if graph.temp_bytes[i]:
            op["temp_bytes"] = int(graph.temp_bytes[i])
        if graph.persistent_bytes[i]:
            op["persistent_bytes"] = int(graph.persistent_bytes[i])
        if graph.colocation[i]:
            op["colocation_group"] = graph.colocation[i][0]
        if graph.pinned_device[i] is not None:
            op["device"] = graph.pinned_device[i]
        if graph.op_types and graph.op_types[i]:
            op["type"] = graph.op_types[i]
        ops.append(op)
    edges = []
    for s, d, o in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_src_output.tolist()):
        edge: dict = {"src": graph.names[s], "dst": graph.names[d]}
        if o < 0:
            edge["control"] = True
        elif o:
            edge["src_output"] = o
        edges.append(edge)
    doc["ops"] = ops
    doc["edges"] = edges
    return doc
