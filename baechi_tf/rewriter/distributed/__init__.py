"""Clusters of several TensorFlow tasks: the cluster spec, device discovery and local workers.

Several hosts run TensorFlow's own distributed runtime: one ``tf.distribute.Server`` per task
(gRPC), all started with the same cluster spec, and a client whose ``tf.compat.v1`` session
targets one of them, the master (``grpc://host:port``). The devices of every task are then
placement targets under their full names (``/job:worker/replica:0/task:1/device:GPU:0``), and a
``FULL_TRACE`` run's step stats hold the remote tasks' devices too, so profiling works unchanged.

* **Cluster spec**: a JSON object like ``TF_CONFIG``'s ``"cluster"``
  (``{"worker": ["host0:2222", "host1:2222"]}``), a file holding one, or ``TF_CONFIG`` itself
  (`resolve_cluster_spec`: the flag wins over the environment).
* **Devices** (`discover_devices`): the client asks the master for the cluster's devices (a
  session's ``list_devices``), within a bounded time; before that it checks that every task's
  port accepts connections, so that an absent worker is named in the error
  (`ClusterUnreachableError`) instead of TensorFlow waiting for it forever. As on one machine
  (`baechi_tf.rewriter.devices`), a task with GPUs contributes its GPUs; a task without them its
  virtual CPU devices CPU:1..CPU:N, which stand in for GPUs (a worker started with
  ``--num_devices=N`` has N + 1 CPU devices; CPU:0 is its host). The master's CPU:0 is the host
  of the placement (ops pinned to ``/cpu:0``). Devices of one task share the intra-task
  communication line, devices of different tasks pay the inter-host one
  (`baechi_tf.cluster.Cluster.link`).
* **Sessions** against a cluster isolate their state (``isolate_session_state``): the profiling
  session and the placed session hold variables of the same names on the same servers, which
  must not be shared.
* **Workers**: ``python -m baechi_tf.rewriter.distributed --cluster_spec=... --task_index=i
  --num_devices=N`` runs task i; `start_local_workers` starts a whole cluster on loopback ports
  of this machine, each task in its own process group, and stops it on exit, on error, at
  interpreter exit and when this process dies (a worker started so exits when its stdin closes).
  A worker can be held to some cores (``--cpu_cores``: every thread of its process, TF's and
  gRPC's, runs only there) and given TF's thread pool sizes (``--inter_op_threads``,
  ``--intra_op_threads``): a task pinned to one core with pools of one thread is one device that
  runs one op at a time, beside the other tasks' cores.

Only `discover_devices`, `remote_session_config` and the worker's ``main`` import TensorFlow.

The parts: `spec` (the cluster spec), `discovery` (reaching the tasks, their devices, the
placement targets), `local_workers` (a cluster on this machine) and `worker` (a task's server,
``__main__`` runs it). Their public names import from here.
"""

from baechi_tf.rewriter.distributed.discovery import (
    DistributedSetup,
    check_timeout,
    cluster_from_flags,
    devices_from_listing,
    discover_devices,
    is_remote_target,
    placement_by_host,
    remote_session_config,
    wait_for_tasks,
)
from baechi_tf.rewriter.distributed.local_workers import LocalWorkers, start_local_workers
from baechi_tf.rewriter.distributed.spec import (
    ClusterSpec,
    ClusterTask,
    ClusterUnreachableError,
    parse_cluster_spec,
    resolve_cluster_spec,
)

__all__ = [
    "ClusterSpec",
    "ClusterTask",
    "ClusterUnreachableError",
    "DistributedSetup",
    "LocalWorkers",
    "check_timeout",
    "cluster_from_flags",
    "devices_from_listing",
    "discover_devices",
    "is_remote_target",
    "parse_cluster_spec",
    "placement_by_host",
    "remote_session_config",
    "resolve_cluster_spec",
    "start_local_workers",
    "wait_for_tasks",
]
