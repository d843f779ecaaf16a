"""The original Baechi workflow (SoCC 2020): profile a model, then place it and measure its steps.

    bazel build :train
    ./bazel-bin/train --costgen --cost_path=/tmp/cost.pkl --model_name=gnmt_v2 ... --num_gpus=4
    ./bazel-bin/train --cost_path=/tmp/cost.pkl (same model flags) --placement_method=m_etf

**Profiling** (``--costgen``) builds the model with synthetic inputs (the training graph, or only
the forward graph with ``--only_forward``), lays it out with the model's own hand ("expert")
layout over ``--num_gpus`` devices, as the original did through the models' ``tf.device``
annotations (GNMT and the Transformer spread their layers round-robin; Inception-v3 runs on
device 0), runs ``--profile_warmup_steps`` untimed steps, then ``--profile_steps`` steps of which
every ``--profile_every_n_steps``-th is traced (FULL_TRACE) and the others timed, and writes the
traces' `CostProfile` to ``--cost_path``. The file is a protobuf message whatever its name (the
original's ``/tmp/cost.pkl`` is kept as a path only; nothing is ever pickled or unpickled).

**Placement** (no ``--costgen``) rebuilds the same graph, loads the profile (taken on the same
graph: checked by fingerprint), places it with ``--placement_method`` (``m_topo``, ``m_etf``,
``m_sct``, ``heft``, ``layers``, ``packed``, ``m_topo_nonuniform``, ``auto``, or the baselines
``single``, everything on one device, and ``expert``, the model's hand layout), prints the
placement summary, the placement time and the simulated step time, then runs the placed graph:
``--warmup_steps`` untimed steps, ``--timed_steps`` timed ones and one traced step, whose step
stats show where each op really ran.

**Devices**: ``--num_gpus`` GPUs when the machine has that many; otherwise ``--num_gpus`` virtual
CPU devices stand in for them (CPU:1..N, with ``--memory_per_device`` each; CPU:0 is the host,
which runs only what must run on a host).

**How the placed graph is run, and ``--only_forward``.** The placer returns a placed *GraphDef*.
Without ``--only_forward`` that GraphDef, the whole training step, is imported
(``tf.import_graph_def``) and run as it is: the variables' initialisers are ops of it, run by name.
(Profiling runs the expert layout the same way: the layout is written into a copy of the
GraphDef. A graph *built* under device annotations would differ: TF sums each device's gradients
apart and groups update ops by device, so its training graph would not be the profiled one.)

With ``--only_forward`` only the forward graph was profiled and placed, and the training step is
built after placement with ``colocate_gradients_with_ops=True``: TF builds each gradient inside
``colocate_with(forward op)``, so it takes the forward op's device and colocation group, and the
optimizer's slots and updates are colocated with their variables. An optimizer needs
``tf.Variable`` objects, which an imported GraphDef lacks, so here the forward graph is rebuilt
(same flags, same op names: the build is deterministic; its fingerprint and devices are checked
against the placed GraphDef) under a device function that gives each op the device of its name in
the placed GraphDef; an op made inside ``colocate_with`` takes its group's device, as in TF. Ops
that get no device either way (the global step) run on TF's default device, the host.

Either way, the traced step's step stats show where each op ran; train.py prints how many ran
elsewhere than placed (none, in every run so far).

Errors in flags or files: one line on stderr and exit status 2.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import time
from typing import Any, Callable, Mapping, Optional

_INTERRUPTED = "train: interrupted; no partial file was written"


def _interrupted_while_loading(signum: int, frame: object) -> None:
    """Ctrl-C while the modules below load and absl parses the flags, before main: the line
    main prints for a Ctrl-C, not a traceback. Nothing has been written yet."""
    print(_INTERRUPTED, file=sys.stderr, flush=True)
    os._exit(130)


# As a program (not imported), and unless SIGINT is ignored (nohup) or handled by someone else.
if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupted_while_loading)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


from absl import app, flags  # noqa: E402

from baechi_tf import interrupts  # noqa: E402
from baechi_tf._startup import flag_parser, import_tensorflow_quietly, run_main  # noqa: E402
from baechi_tf.cost_model.machine_load import LoadMeter, busy_warning  # noqa: E402
from baechi_tf.errors import ConfigError  # noqa: E402
from baechi_tf.models import MODEL_NAMES  # noqa: E402  (TensorFlow loads only in main)
from baechi_tf.options import FLAGS as OPTION_FLAGS, define_absl_flags, options_from  # noqa: E402
from baechi_tf.placer.pipeline import PlacementOptions  # noqa: E402
from baechi_tf.ranges import SHARE_OF_MEMORY, check_range  # noqa: E402
from baechi_tf.report import counted  # noqa: E402

_OPTIMIZERS = ("adadelta", "adagrad", "adam", "ftrl", "momentum", "sgd", "rmsprop")
_MODEL = "(default: the model's own; see baechi_tf/models)"

# --- flags of the original's train.py ----------------------------------------------------------
flags.DEFINE_bool("log_device_placement", False, "Log where TF puts each op (ConfigProto).")
flags.DEFINE_bool(
    "colocate_grads_with_ops", False,
    "Build gradients with colocate_gradients_with_ops: each gradient op goes where its forward op "
    "goes. Required by --only_forward.")
flags.DEFINE_enum("optimizer", "sgd", _OPTIMIZERS, "Optimizer of the training step.")
# Values of the original's flags that worked there and are not ported: refused with what to use.
_ORIGINAL_MODELS = ("cifarnet", "attention_nmt")
flags.DEFINE_enum("model_name", "inception_v3", [*MODEL_NAMES, *_ORIGINAL_MODELS],
                  f"Model to build ({', '.join(_ORIGINAL_MODELS)}: the original's, not ported).")
flags.DEFINE_integer("batch_size", None, f"Batch size of the synthetic input {_MODEL}.",
                     lower_bound=1)
flags.DEFINE_float("learning_rate", 0.01, "Learning rate of the optimizer.")
flags.DEFINE_string(
    "logdir", "",
    "If set: the graph and the traced steps' run metadata for TensorBoard, and "
    "run_metadata-<step>.pbtxt for each traced step.")
flags.DEFINE_string(
    "cost_path", "/tmp/cost.pkl",
    "Cost profile written by --costgen and read by placement. A protobuf CostProfile, whatever "
    "the file's name.")
flags.DEFINE_bool("costgen", False, "Profile the model, write --cost_path and exit.")
flags.DEFINE_bool(
    "only_forward", False,
    "Profile and place only the forward graph (target: the loss); the training ops are built "
    "after placement and follow their forward ops (needs --colocate_grads_with_ops).")
flags.DEFINE_float(
    "memory_fraction", 1.0,
    "Share of each device's memory in use: per_process_gpu_memory_fraction on GPUs; it also "
    "scales the memory the placer sees (GPUs and CPU stand-ins alike).")
flags.DEFINE_string("comm_cost_coeffs", "0.0001754,134",
                    "Transfer time 'slope,intercept' in us per byte and us "
                    "(utils/communication_benchmark prints it), or 'auto': fit it to copies "
                    "timed between two of the devices before placing (about a second).")
flags.DEFINE_float("comm_cost_factor", 1.0, "Multiplies both communication coefficients.")
flags.DEFINE_float("cost_factor", 1.0,
                   "Multiplies every profiled op's compute time, and so the estimates made from "
                   "them (ops of a type never profiled keep the 1 us default), and both "
                   "communication coefficients.")
flags.DEFINE_enum("data_format", "NHWC", ["NHWC", "NCHW"], "Image layout of Inception-v3.")
flags.DEFINE_integer("vocab_size", None, f"NMT/Transformer vocabulary {_MODEL}.", lower_bound=1)
flags.DEFINE_integer("max_seq_length", None,
                     f"Sequence length = unrolled steps of the NMT models {_MODEL}.", lower_bound=1)
flags.DEFINE_integer("rnn_units", None, f"NMT hidden and embedding size {_MODEL}.", lower_bound=1)
flags.DEFINE_integer("num_layers", None, f"NMT/Transformer layers {_MODEL}.", lower_bound=1)
flags.DEFINE_enum("rnn_unit_type", None, ["lstm", "gru"], f"NMT cell {_MODEL}.")
flags.DEFINE_enum("encoder_type", None, ["bi", "uni", "gnmt"],
                  f"NMT encoder; GNMT needs 'gnmt' {_MODEL}.")
flags.DEFINE_bool("residual", None, f"NMT residual connections on the upper layers {_MODEL}.")
flags.DEFINE_integer(
    "num_gpus", 1,
    "Devices to profile, place and run on: GPUs, or as many virtual CPU devices standing in for "
    "GPUs when the machine has fewer. Also the devices of the models' expert layout.",
    lower_bound=1)
flags.DEFINE_bool("disable_nmt_colocation", False,
                  "Turn off the NMT models' per-(layer, step) colocation groups.")

# --- placer flags (the original's placer_lib and grouper) -----------------------------------------
# The placement options' flags, as baechi place has them (baechi_tf.options); --placement_method
# takes any name ('expert' too; PlacementOptions names the original's that are not ported), and
# --placer_type the original's 'colocation' (refused with what to use instead).
define_absl_flags(flags, flags.FLAGS, names=tuple(f.field for f in OPTION_FLAGS),
                  any_value=("placement_method",), more_choices={"placer_type": ("colocation",)})
for _flag in OPTION_FLAGS:
    flags.declare_key_flag(_flag.flag)
flags.DEFINE_bool("log_placer_device_placement", False, "Print 'op: device' for every op placed.")

# --- the original's other flags: accepted where they apply, else refused when set ---------------
flags.DEFINE_bool(
    "fusion_check_disjoint_paths", False,
    "Fusion: search for a second path exactly before each merge, without the search budget after "
    "which fusion here falls back to the conservative rule (the default checks exactly within it).")
flags.DEFINE_bool("fusion_allow_cycle", False,
                  "Not ported: fusion without a cycle check makes graphs TF cannot run.")
flags.DEFINE_bool("only_important_ops", False,
                  "Not ported (it needs Grappler's important-op analysis): the whole graph is placed.")
flags.DEFINE_string("adjustment_method", "noop",
                    "The original's post-placement adjuster: only its default, noop, is here.")
flags.DEFINE_bool("adjustment_with_memory_limit", False, "Not ported (adjuster).")
flags.DEFINE_bool("grappler", False, "Not ported: Grappler's hierarchical RL placer.")
flags.DEFINE_integer("grappler_time", 3600, "Grappler's RL placer only (not ported).")
flags.DEFINE_string("stats_path", "./stats.log", "Unused, as in the original (dead code there).")
flags.DEFINE_string("device_info_path", "./device_info.json", "Unused, as in the original.")
flags.DEFINE_bool("log_colocation_graph", False, "Colocation placer only (not ported).")
flags.DEFINE_bool("resolve_cycle", False, "Colocation placer only (not ported).")
flags.DEFINE_bool("consider_all_edges_in_grouping", False, "Colocation placer only (not ported).")

# (flag, value that is refused, why): what a run of the original's command line that needs them
# cannot get here.
_NOT_PORTED = (
    ("fusion_allow_cycle", True, "fusion without a cycle check can make a cyclic graph TF cannot "
     "run; leave it off (fusion checks for cycles)"),
    ("only_important_ops", True, "it needs Grappler's important-op analysis; the whole graph is "
     "placed instead: leave it off"),
    ("adjustment_with_memory_limit", True, "the original's post-placement adjuster is not ported; "
     "leave it off"),
    ("grappler", True, "Grappler's hierarchical RL placer is not ported (it took hours where "
     "Baechi takes seconds); use --placement_method"),
)


def _refuse_unported() -> None:
    for flag, refused, why in _NOT_PORTED:
        if FLAGS[flag].value == refused:
            raise ConfigError(f"--{flag} is not supported: {why}")
    if FLAGS.model_name in _ORIGINAL_MODELS:
        raise ConfigError(
            f"--model_name={FLAGS.model_name} is the original's, not ported: choose one of "
            f"{', '.join(MODEL_NAMES)}")
    if FLAGS.placer_type == "colocation":
        raise ConfigError(
            "--placer_type=colocation is the original's ColocationGraphPlacer, not ported (it was "
            "broken there); every placer here keeps TF's colocation groups: use --placer_type=default "
            "or --placer_type=fusion")
    if FLAGS.adjustment_method != "noop":
        raise ConfigError(
            f"--adjustment_method={FLAGS.adjustment_method}: the original's post-placement adjuster "
            "is not ported (its default, noop, changes nothing); leave it out")


# --- ours ----------------------------------------------------------------------------------------
flags.DEFINE_bool(
    "allow_profile_mismatch", False,
    "Place with a --cost_path profile taken on another graph (other model flags): the costs of "
    "the ops that match are used, the others estimated, and the summary says what did not match.")
flags.DEFINE_string("memory_per_device", "8GiB",
                    "Memory of each CPU stand-in for a GPU: bytes, or a number with a unit "
                    "KiB, MiB, GiB, TiB (of 1024) or KB, MB, GB, TB (of 1000), e.g. 8GiB or 512MiB.")
flags.DEFINE_string(
    "cluster_spec", None,
    "Place and run across a running TF cluster: JSON like TF_CONFIG's \"cluster\" or a file "
    "holding it (default: TF_CONFIG's cluster, else this machine). --num_gpus is then per task.")
flags.DEFINE_string("inter_host_comm_cost_coeffs", None,
                    "'slope,intercept' between hosts (default: --comm_cost_coeffs).")
flags.DEFINE_float("cluster_timeout", 30.0, "Seconds to wait for the cluster's tasks.")
flags.DEFINE_string("report_dir", "",
                    "If set: Gantt chart, memory per device, Chrome trace (with the traced step), "
                    "TensorBoard graph and summary.json of the placement, written before the "
                    "placed graph runs.")
flags.DEFINE_integer("image_size", None, f"Inception-v3 input height and width {_MODEL}.",
                     lower_bound=1)
flags.DEFINE_float("depth_multiplier", None, f"Inception-v3 convolution depth scale {_MODEL}.")
flags.DEFINE_integer("num_classes", None, f"Inception-v3 classes {_MODEL}.", lower_bound=1)
flags.DEFINE_integer("num_heads", None, f"Transformer attention heads {_MODEL}.", lower_bound=1)
flags.DEFINE_integer("d_model", None, f"Transformer width {_MODEL}.", lower_bound=1)
flags.DEFINE_integer("d_ff", None, f"Transformer feed-forward width {_MODEL}.", lower_bound=1)
flags.DEFINE_integer("profile_warmup_steps", 5, "--costgen: untimed steps first.", lower_bound=0)
flags.DEFINE_integer("profile_steps", 50, "--costgen: steps after the warm-up.", lower_bound=1)
flags.DEFINE_integer("profile_every_n_steps", 5,
                     "--costgen: every n-th of those steps is traced, the others timed.",
                     lower_bound=1)
flags.DEFINE_integer("warmup_steps", 10, "Placement: untimed steps of the placed graph.",
                     lower_bound=0)
flags.DEFINE_integer("timed_steps", 50,
                     "Placement: timed steps of the placed graph (one traced step follows).",
                     lower_bound=1)

FLAGS = flags.FLAGS

# train.py flag -> the models' hyper-parameter of the same name (unset flags keep the model's).
_MODEL_FLAGS = ("batch_size", "vocab_size", "max_seq_length", "rnn_units", "num_layers",
                "rnn_unit_type", "encoder_type", "residual", "num_gpus", "data_format",
                "image_size", "depth_multiplier", "num_classes", "num_heads", "d_model", "d_ff",
                "disable_nmt_colocation")


# --------------------------------------------------------------------------------------- graphs


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What defines the graph: the model and how its training step is built."""

    model_name: str
    hparams: Any  # the model's hyper-parameter dataclass
    optimizer: str = "sgd"
    learning_rate: float = 0.01
    colocate_grads_with_ops: bool = False
    only_forward: bool = False  # profile and place the forward graph only


@dataclasses.dataclass(frozen=True, eq=False)
class Built:
    """A model built into a graph, with its target (train op, or the loss when forward only)."""

    spec: Any  # baechi_tf.models.ModelSpec
    target: Any  # what one step runs
    graph_def: Any  # the graph that is profiled and placed


@dataclasses.dataclass(frozen=True, eq=False)
class Runnable:
    """A graph ready to run: its target, the variables' initialisers and the feeds."""

    graph: Any
    target: Any
    init: Any  # list of ops or one op
    feeds: Mapping[str, Any]


def make_optimizer(name: str, learning_rate: float) -> Any:
    """The original's ``tf.train.*Optimizer(lr)``; momentum gets 0.9 (the original forgot it)."""
    import tensorflow as tf

    train = tf.compat.v1.train
    if name == "momentum":
        return train.MomentumOptimizer(learning_rate, momentum=0.9)
    cls = {"adadelta": train.AdadeltaOptimizer, "adagrad": train.AdagradOptimizer,
           "adam": train.AdamOptimizer, "ftrl": train.FtrlOptimizer,
           "sgd": train.GradientDescentOptimizer, "rmsprop": train.RMSPropOptimizer}[name]
    return cls(learning_rate)


def _train_op(config: TrainConfig, loss: Any, colocate: bool) -> Any:
    import tensorflow as tf

    optimizer = make_optimizer(config.optimizer, config.learning_rate)
    grads = optimizer.compute_gradients(loss, colocate_gradients_with_ops=colocate)
    global_step = tf.compat.v1.train.create_global_step()
    return optimizer.apply_gradients(grads, global_step=global_step)


def build_graph(config: TrainConfig) -> Built:
    """Builds the model, and its training step unless `config.only_forward`, into a new graph.

    The graph has no device fields, and is placed and run as a GraphDef: TF sums the gradients
    of each device apart and groups update ops by device, so a training graph built under device
    annotations would not be the graph that was profiled.
    """
    import tensorflow as tf

    from baechi_tf.models import build_model

    graph = tf.Graph()
    with graph.as_default():
        spec = build_model(config.model_name, config.hparams, graph=graph)
        target = spec.loss
        if not config.only_forward:
            target = _train_op(config, spec.loss, config.colocate_grads_with_ops)
    return Built(spec=spec, target=target, graph_def=graph.as_graph_def())


def import_placed(built: Built, placed_def: Any) -> Runnable:
    """The placed GraphDef itself, imported into a new graph, with `built`'s target and feeds.

    The variables' initialisers are ops of the GraphDef (run by name), so no ``tf.Variable``
    object is needed.
    """
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(placed_def, name="")
    with built.spec.graph.as_default():
        init_names = [v.initializer.name for v in tf.compat.v1.global_variables()]
    return Runnable(
        graph=graph,
        target=graph.as_graph_element(built.target.name),
        init=[graph.get_operation_by_name(n) for n in init_names],
        feeds=built.spec.feeds,
    )


def rebuild_forward_placed(config: TrainConfig, placed_def: Any) -> Runnable:
    """--only_forward: the forward graph rebuilt on the devices of `placed_def`, then its
    training step, built after placement with gradients colocated with their forward ops.

    The model is rebuilt (same flags, same op names; checked below) under a device function that
    gives each op the device of its name in `placed_def`; an op made inside ``colocate_with``
    takes its group's device instead, as TF does. The optimizer needs ``tf.Variable`` objects,
    which an imported GraphDef lacks: that is why the forward graph is rebuilt, not imported.
    """
    import tensorflow as tf

    from baechi_tf.cost_model.profile import graph_fingerprint
    from baechi_tf.models import build_model

    devices = {n.name: n.device for n in placed_def.node if n.device}
    graph = tf.Graph()
    with graph.as_default():
        with graph.device(lambda op: devices.get(op.name, "")):
            spec = build_model(config.model_name, config.hparams, graph=graph)
        forward_def = graph.as_graph_def()
        target = _train_op(config, spec.loss, colocate=True)
        init = tf.compat.v1.global_variables_initializer()
    # TF builds variable initialisers under device(None), colocated with their variable: they
    # have no device field but run where the variable is. Any other difference is an error.
    moved = [n.name for n in forward_def.node
             if n.device and canonical_device(n.device) != canonical_device(devices.get(n.name, ""))]
    if moved or graph_fingerprint(forward_def) != graph_fingerprint(placed_def):
        raise ConfigError(
            f"the rebuilt forward graph differs from the placed one ({len(moved)} ops on other "
            "devices); rebuild it with the flags it was profiled with")
    return Runnable(graph=graph, target=target, init=init, feeds=spec.feeds)


def canonical_device(name: str) -> str:
    import tensorflow as tf

    return tf.DeviceSpec.from_string(name).to_string() if name else ""


def ran_on(step_stats: Any, graph: Any) -> dict[str, str]:
    """Op name -> the device it ran on in a traced step, for the ops of `graph`."""
    names = {op.name for op in graph.get_operations()}
    out = {}
    for dev in step_stats.dev_stats:
        last = dev.device.split("/")[-1]
        if not last.startswith("device:") or last.count(":") != 2:
            continue  # GPU streams and memcpy entries repeat the executor's records
        device = canonical_device(dev.device)
        for ns in dev.node_stats:
            if ns.node_name in names:
                out[ns.node_name] = device
    return out


# ------------------------------------------------------------------------------------ stepping


class Progress:
    """Steps done, the mean step time and what is left, on stderr (redrawn on a terminal)."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total = label, total
        self.tty = sys.stderr.isatty()
        self.every = 1 if self.tty else max(1, total // 10)
        self.started = time.perf_counter()

    def step(self, done: int) -> None:
        if done % self.every and done != self.total:
            return
        spent = time.perf_counter() - self.started
        left = spent / done * (self.total - done)
        line = (f"{self.label}: step {done}/{self.total}, {1e3 * spent / done:.1f} ms/step, "
                f"{left:.0f} s left")
        if self.tty:
            end = "\n" if done == self.total else ""
            sys.stderr.write("\r" + line + "\x1b[K" + end)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def run_steps(
    session: Any,
    target: Any,
    feeds: Mapping[str, Any],
    *,
    label: str,
    warmup: int,
    steps: int,
    trace_every: int,
    on_trace: Callable[[int, Any], None],
) -> list[float]:
    """`warmup` untimed steps, then `steps` steps of which every `trace_every`-th is traced
    (`on_trace(step, run_metadata)`) and the others timed; returns the timed steps' seconds."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    if warmup:
        progress = Progress(f"{label} warm-up", warmup)
        for i in range(warmup):
            session.run(target, feed_dict=feeds)
            interrupts.check()
            progress.step(i + 1)
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
    timed = []
    progress = Progress(label, steps)
    for step in range(1, steps + 1):
        if step % trace_every == 0:
            metadata = tf1.RunMetadata()
            session.run(target, feed_dict=feeds, options=options, run_metadata=metadata)
            on_trace(step, metadata)
        else:
            t0 = time.perf_counter()
            session.run(target, feed_dict=feeds)
            timed.append(time.perf_counter() - t0)
        interrupts.check()
        progress.step(step)
    return timed


class _Logdir:
    """--logdir: the graph and the traced steps' run metadata for TensorBoard, and pbtxt files."""

    def __init__(self, logdir: str, graph: Any) -> None:
        import tensorflow as tf

        self.logdir = logdir
        self.writer = None
        if logdir:
            os.makedirs(logdir, exist_ok=True)
            with graph.as_default():  # the v1 writer refuses to start under eager execution
                self.writer = tf.compat.v1.summary.FileWriter(logdir, graph)

    def add(self, tag: str, step: int, metadata: Any) -> None:
        if self.writer is None:
            return
        from google.protobuf import text_format

        from baechi_tf._files import atomic_write

        self.writer.add_run_metadata(metadata, f"{tag}_step_{step}", global_step=step)
        atomic_write(os.path.join(self.logdir, f"run_metadata-{tag}-{step}.pbtxt"),
                     text_format.MessageToString(metadata))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def run_graph(run: Runnable, session_config: Any, *, target: str = "", tag: str, label: str, warmup: int,
              steps: int, trace_every: int, result: Any = None) -> tuple[list[float], list[Any]]:
    """Initialises `run` in a new session and runs `run_steps`; returns (timed seconds, the
    traced steps' StepStats). With --logdir, each traced step's run metadata is kept there.
    Running out of device memory is an `InfeasiblePlacementError` naming the device and, given
    the placement `result`, the peak the placer expected there."""
    import tensorflow as tf

    logdir = _Logdir(FLAGS.logdir, run.graph)
    traces: list[Any] = []

    def keep(step: int, metadata: Any) -> None:
        traces.append(metadata.step_stats)
        logdir.add(tag, step, metadata)

    try:
        with tf.compat.v1.Session(target, graph=run.graph, config=session_config) as sess:
            sess.run(run.init)
            timed = run_steps(sess, run.target, run.feeds, label=label, warmup=warmup,
                              steps=steps, trace_every=trace_every, on_trace=keep)
    except tf.errors.ResourceExhaustedError as e:
        from baechi_tf.rewriter.oom import out_of_memory_error

        raise out_of_memory_error(e, result, when=f" while {label}") from e
    finally:
        logdir.close()
    return timed, traces


# --------------------------------------------------------------------------------------- main


def _config_from_flags() -> TrainConfig:
    from baechi_tf.models import hparams_from_flags

    values = {name: FLAGS[name].value for name in _MODEL_FLAGS if FLAGS[name].value is not None}
    return TrainConfig(
        model_name=FLAGS.model_name,
        hparams=hparams_from_flags(FLAGS.model_name, values),
        optimizer=FLAGS.optimizer,
        learning_rate=FLAGS.learning_rate,
        colocate_grads_with_ops=FLAGS.colocate_grads_with_ops,
        only_forward=FLAGS.only_forward,
    )


def _comm_costs() -> tuple[Any, Any]:
    """(--comm_cost_coeffs, --inter_host_comm_cost_coeffs or None) as `CommCost` lines, scaled by
    --comm_cost_factor and --cost_factor; --memory_fraction checked too. TensorFlow is not needed:
    a bad value is refused before it loads, naming the flag (a factor of inf, or one that scaled
    a coefficient past what a copy may take, was a line about 'communication slope_us_per_byte'
    after TensorFlow had loaded, naming no flag)."""
    from baechi_tf.cluster import MAX_COPY_US, CommCost

    check_range("--memory_fraction", FLAGS.memory_fraction, SHARE_OF_MEMORY)
    for name in ("comm_cost_factor", "cost_factor"):
        value = FLAGS[name].value
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"--{name}={value} must be a finite number > 0")
    scale = FLAGS.comm_cost_factor * FLAGS.cost_factor

    def scaled(flag: str) -> Optional[CommCost]:
        text = FLAGS[flag].value
        if flag == "comm_cost_coeffs" and text.strip().lower() == "auto":
            return None  # fitted once the devices are there (`_devices`)
        try:
            line = CommCost.parse(text)
        except ConfigError as e:
            raise ConfigError(f"--{flag}={text!r}: {e}") from None
        try:
            return CommCost(line.slope_us_per_byte * scale, line.intercept_us * scale)
        except ConfigError:  # only the factors can bring a valid line past the limits
            raise ConfigError(
                f"--comm_cost_factor={FLAGS.comm_cost_factor:g} times --cost_factor="
                f"{FLAGS.cost_factor:g} makes --{flag}={text!r} a copy of more than the "
                f"{MAX_COPY_US:g} us (31 years) a step may take; give smaller factors") from None

    inter = FLAGS.inter_host_comm_cost_coeffs
    return scaled("comm_cost_coeffs"), scaled("inter_host_comm_cost_coeffs") if inter else None


def _devices() -> tuple[Any, Any, str]:
    """(DeviceSetup, session ConfigProto, session target) for --num_gpus devices, on this
    machine or, with --cluster_spec (or TF_CONFIG), on every task of a running cluster."""
    import tensorflow as tf

    from baechi_tf.cluster import CommCost
    from baechi_tf.rewriter.devices import resolve_memory, session_config, session_devices

    fraction = FLAGS.memory_fraction
    comm, inter = _comm_costs()
    memory = resolve_memory(FLAGS.memory_per_device)  # stand-ins' and GPUs' alike get `fraction` of theirs
    base = tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                    log_device_placement=FLAGS.log_device_placement)
    if fraction != 1.0:
        base.gpu_options.per_process_gpu_memory_fraction = fraction
    from baechi_tf.rewriter.distributed import cluster_from_flags, remote_session_config

    remote = cluster_from_flags(
        FLAGS.cluster_spec,
        num_devices=FLAGS.num_gpus if FLAGS["num_gpus"].present else None,
        memory_per_device=memory,
        memory_fraction=fraction,
        comm_cost_coeffs=comm or CommCost(),
        inter_host_comm_cost_coeffs=inter,
        timeout_s=FLAGS.cluster_timeout,
        config=base,
    )
    if remote is not None:
        setup = remote.devices
        return _fitted(setup, remote_session_config(session_config(setup, base, grappler=False)), remote.target, comm)
    if inter is not None:  # it was dropped without a word
        print("train: --inter_host_comm_cost_coeffs is not used: every device is on this host (give "
              "--cluster_spec, or TF_CONFIG, to run across hosts)", file=sys.stderr, flush=True)
    setup = session_devices(
        FLAGS.num_gpus,
        memory_bytes_per_device=memory,
        memory_fraction=fraction,
        comm=comm or CommCost(),
        config=base,
    )
    # Grappler off: --costgen profiles under the expert layout, whose devices split ops that the
    # remapper would fuse into one node on one of them.
    return _fitted(setup, session_config(setup, base, grappler=False), "", comm)


def _fitted(setup: Any, config: Any, target: str, comm: Any) -> tuple[Any, Any, str]:
    """(setup, config, target), the setup's link fitted to copies between two of its devices
    and scaled by --comm_cost_factor and --cost_factor when --comm_cost_coeffs=auto (`comm`
    None), and the fit printed."""
    if comm is not None:
        return setup, config, target
    from baechi_tf.cluster import CommCost
    from baechi_tf.rewriter.devices import with_fitted_link

    setup, fit = with_fitted_link(setup, config, target)
    if fit is not None:
        print(f"train: {fit.describe()}", flush=True)
        scale = FLAGS.comm_cost_factor * FLAGS.cost_factor
        c = fit.comm
        line = CommCost(c.slope_us_per_byte * scale, c.intercept_us * scale, c.copies_in_flight)
        setup = dataclasses.replace(setup, cluster=dataclasses.replace(setup.cluster, comm=line))
    return setup, config, target


def _check_data_format(config: TrainConfig, setup: Any, target: str) -> None:
    """NCHW on CPU stand-ins whose kernels take only NHWC: an error now, not in the first step.

    A cluster's workers are not asked (their kernels are in other processes).
    """
    if getattr(config.hparams, "data_format", "NHWC") != "NCHW" or not setup.virtual or target:
        return
    from baechi_tf.models.inception_v3 import nchw_runs_on_cpu

    if not nchw_runs_on_cpu():
        raise ConfigError(
            "--data_format=NCHW: this machine's CPU kernels convolve and pool NHWC images only "
            "(TensorFlow's oneDNN kernels, which take NCHW, are off here); give "
            "--data_format=NHWC, or set TF_ENABLE_ONEDNN_OPTS=1")


def _describe_devices(setup: Any) -> str:
    several_tasks = len({d.task for d in setup.cluster.devices}) > 1
    names = ", ".join(d.name if several_tasks else d.name.split("/")[-1] for d in setup.cluster.devices)
    if setup.virtual:
        one = setup.cluster.num_devices == 1
        return (f"{setup.cluster.num_devices} virtual CPU device{'' if one else 's'} standing in for "
                f"GPU{'' if one else 's'} "
                f"({names}; CPU:0 is the host)")
    return f"{setup.cluster.num_devices} GPUs ({names})"


def _describe_graph(config: TrainConfig, built: Built) -> str:
    what = "forward graph" if config.only_forward else "training graph"
    return f"{config.model_name}: {what} of {len(built.graph_def.node)} ops"


def costgen(config: TrainConfig, setup: Any, session_config: Any, target: str = "") -> int:
    """Profiles the model under its expert layout and writes the profile to --cost_path."""
    import tensorflow as tf

    from baechi_tf.cost_model.profile import save_profile
    from baechi_tf.cost_model.profiler import fit_outputs_to_graph, profile_from_step_stats
    from baechi_tf.rewriter.apply import apply_placement

    if FLAGS.profile_every_n_steps > FLAGS.profile_steps:
        raise ConfigError(
            f"--profile_every_n_steps={FLAGS.profile_every_n_steps} > --profile_steps="
            f"{FLAGS.profile_steps}: no step would be traced")
    built = build_graph(config)
    print(_describe_graph(config, built))
    layout = built.spec.expert_placement(setup.cluster.names, built.graph_def)
    run = import_placed(built, apply_placement(built.graph_def, layout))
    used = {canonical_device(d) for d in layout.values()}
    print(f"Profiling on {_describe_devices(setup)}, with the model's expert layout over "
          f"{len(used)} of them")
    with LoadMeter() as meter:
        timed, traces = run_graph(
            run, session_config, target=target, tag="costgen", label="profiling",
            warmup=FLAGS.profile_warmup_steps, steps=FLAGS.profile_steps, trace_every=FLAGS.profile_every_n_steps)
    busy = busy_warning(meter.load, "the profiling steps")
    if busy:
        print(f"train: {busy}", file=sys.stderr, flush=True)
    profile = fit_outputs_to_graph(
        profile_from_step_stats(traces, built.graph_def, tf_version=tf.__version__),
        built.spec.graph)
    profile = dataclasses.replace(profile, machine_load=meter.load)
    save_profile(profile, FLAGS.cost_path)
    if timed:
        print(f"Original runtime: {1e3 * sum(timed) / len(timed):.3f} ms per step "
              f"(mean of {counted(len(timed), 'untraced step')})")
    print(f"Profile of {len(profile.ops)} ops over {counted(len(traces), 'traced step')} written to "
          f"{FLAGS.cost_path} (protobuf CostProfile)")
    return 0


def _scaled(profile: Any, factor: float) -> Any:
    """`profile` with its compute times times --cost_factor `factor`."""
    from baechi_tf.graph import MAX_TOTAL_COMPUTE_US

    if factor == 1.0:
        return profile
    if not profile.profiled_compute_us * factor <= MAX_TOTAL_COMPUTE_US:  # the importer refuses it
        raise ConfigError(
            f"--cost_factor={factor:g} makes the profile's {profile.profiled_compute_us:.3g} us of "
            f"compute per step more than the {MAX_TOTAL_COMPUTE_US:g} us (31 years) a step may take; "
            "give a smaller factor")
    ops = {name: dataclasses.replace(c, compute_us=c.compute_us * factor)
           for name, c in profile.ops.items()}
    return dataclasses.replace(profile, ops=ops)


def _check_only_forward(config: TrainConfig, profile: Any, built: Built) -> None:
    """A profile of these model flags but the other --only_forward (the README's commands give it
    to both runs) is refused saying so: the general mismatch error says to profile again, which
    the flag makes needless."""
    from baechi_tf.cost_model.profile import compare_to_graph

    if compare_to_graph(profile, built.graph_def) is None:
        return
    other = dataclasses.replace(config, only_forward=not config.only_forward)
    if compare_to_graph(profile, build_graph(other).graph_def) is not None:
        return  # another difference: the importer's error lists it
    if config.only_forward:
        raise ConfigError(
            f"the cost profile {FLAGS.cost_path!r} is of the whole training graph (profiled without "
            "--only_forward): leave out --only_forward, as when it was profiled")
    raise ConfigError(
        f"the cost profile {FLAGS.cost_path!r} is of the forward graph only (profiled with "
        "--only_forward): add --only_forward, as when it was profiled")


def place_and_run(
    config: TrainConfig, options: PlacementOptions, setup: Any, session_config: Any, target: str = ""
) -> int:
    """Places the graph with the profile by `options` (the flags' placement options, checked),
    prints the figures, runs the placed graph."""
    from baechi_tf.cost_model.profile import load_profile
    from baechi_tf.rewriter.graph_pass import place_graph_def

    profile = _scaled(load_profile(FLAGS.cost_path), FLAGS.cost_factor)
    built = build_graph(config)
    print(_describe_graph(config, built))
    if not FLAGS.allow_profile_mismatch:
        _check_only_forward(config, profile, built)
    method = options.placement_method
    if method in ("expert", "auto"):
        options = dataclasses.replace(
            options, expert=built.spec.expert_placement(setup.cluster.names, built.graph_def)
        )
    print(f"Placing with {method} on {_describe_devices(setup)}")
    t0 = time.perf_counter()
    placed_def, report = place_graph_def(
        built.graph_def, profile, setup.cluster, options,
        host_device=setup.host, device_aliases=setup.aliases,
        allow_profile_mismatch=FLAGS.allow_profile_mismatch)
    placement_seconds = time.perf_counter() - t0
    print(report.summary())
    steps = ", ".join(f"{k} {v:.3f} s" for k, v in report.step_seconds.items())
    print(f"Entire placement time: {placement_seconds:.3f} s ({steps})")
    print(f"Simulated step time: {report.makespan_us / 1e3:.3f} ms")
    if FLAGS.log_placer_device_placement:
        for node in sorted(placed_def.node, key=lambda n: n.name):
            print(f"{node.name}: {node.device}")
    if FLAGS.report_dir:
        from baechi_tf.reports import add_tf_timeline, write_reports

        # Before the run: a run that fails (out of memory) or is stopped leaves them too.
        write_reports(report.result, FLAGS.report_dir, graph_def=placed_def)
        print(f"Reports written to {FLAGS.report_dir}")

    if config.only_forward:
        run = rebuild_forward_placed(config, placed_def)
        print(f"Training ops built after placement: "
              f"{len(run.graph.get_operations()) - len(placed_def.node)} more ops, gradients "
              "colocated with their forward ops")
    else:
        run = import_placed(built, placed_def)
    with LoadMeter() as meter:
        timed, traced = run_graph(
            run, session_config, target=target, tag="placed", label="timing placed graph",
            warmup=FLAGS.warmup_steps, steps=FLAGS.timed_steps + 1, trace_every=FLAGS.timed_steps + 1,
            result=report.result)
    print(f"Average step time (measured): {1e3 * sum(timed) / len(timed):.3f} ms "
          f"(mean of {counted(len(timed), 'step')})")
    busy = busy_warning(meter.load, "the placed graph's steps", "they ran slower than on an idle machine")
    if busy:
        print(f"train: {busy}", file=sys.stderr, flush=True)
    _print_where_ops_ran(traced[0], run.graph, placed_def)
    if FLAGS.report_dir:
        trace = add_tf_timeline(report.result, FLAGS.report_dir, traced[0])
        print(f"TensorFlow's timeline of the traced step added to {trace}")
    return 0


def _print_where_ops_ran(step_stats: Any, graph: Any, placed_def: Any) -> None:
    """Where the traced step ran each op, against the placement (and, for ops built after
    placement, against the device TF gave them)."""
    ran = ran_on(step_stats, graph)
    per_device: dict[str, int] = {}
    for device in ran.values():
        per_device[device] = per_device.get(device, 0) + 1
    from baechi_tf.cluster import device_task

    several_tasks = len({device_task(d) for d in per_device}) > 1  # CPU:1 of each task, told apart
    counts = ", ".join(f"{d if several_tasks else d.split('/')[-1]} {n}"
                       for d, n in sorted(per_device.items()))
    devices = "1 device" if len(per_device) == 1 else f"{len(per_device)} devices"
    print(f"Traced step: {len(ran)} ops ran on {devices} ({counts})")
    expected = {n.name: canonical_device(n.device) for n in placed_def.node}
    for op in graph.get_operations():
        if op.name not in expected and op.device:
            expected[op.name] = canonical_device(op.device)
    placed = [n for n in ran if n in expected]
    elsewhere = [n for n in placed if ran[n] != expected[n]]
    print(f"Ops that ran where placed: {len(placed) - len(elsewhere)} of {len(placed)}; "
          f"elsewhere: {len(elsewhere)}" + (f" (first: {elsewhere[0]})" if elsewhere else ""))


def _check_outputs() -> None:
    """The files and folders the run will write, and the profile a placing run reads, checked
    before TensorFlow loads and the long work starts: a bad one is a `ConfigError` at once, not a
    traceback after the work (or, for a missing profile, an error after TensorFlow's 8 s load)."""
    from baechi_tf._files import check_apart, check_output_folder, check_report_folder, check_writable

    for flag in ("cost_path", "logdir", "report_dir"):
        value = getattr(FLAGS, flag)
        if value and not value.strip():  # it named a folder ' ' in the working directory
            raise ConfigError(f"--{flag}={value!r} is blank; give a path, or leave the flag out")
    if not FLAGS.cost_path:
        raise ConfigError("--cost_path is empty; give the profile's path")
    if FLAGS.logdir:
        check_output_folder(FLAGS.logdir, "--logdir")
    if FLAGS.costgen:
        check_writable(FLAGS.cost_path, "--cost_path")
        from baechi_tf.cost_model.profile import not_a_profile_to_replace

        why = not_a_profile_to_replace(FLAGS.cost_path)
        if why:  # a typo naming a source file was written over without a word
            raise ConfigError(
                f"--cost_path {FLAGS.cost_path!r} is a file that is not a cost profile ({why}), and "
                "--costgen would write over it; give another path, or remove the file first"
            )
        if FLAGS.logdir:
            check_apart(FLAGS.logdir, "--logdir", FLAGS.cost_path, "--cost_path")
    elif FLAGS.report_dir:  # profiling writes no reports
        check_report_folder(FLAGS.report_dir, "--report_dir", keep=(FLAGS.cost_path,))
    if not FLAGS.costgen and not os.path.lexists(FLAGS.cost_path):  # at once, not after TF loads
        raise ConfigError(
            f"cost profile {FLAGS.cost_path!r} does not exist; make it first: the same flags with --costgen"
        )


def _warn_of_unused_model_flags() -> None:
    """Says on stderr which model flags given are not the model's (the original dropped them
    without a word: ``--model_name=transformer --rnn_units=64`` kept the Transformer's width)."""
    from baechi_tf.models import flags_without_use

    given = [name for name in _MODEL_FLAGS if name != "num_gpus" and FLAGS[name].present]
    unused = flags_without_use(FLAGS.model_name, given)
    if unused:
        names = ", ".join(f"--{name}" for name in unused)
        print(f"train: {FLAGS.model_name} has no use for {names}; "
              f"{'it is' if len(unused) == 1 else 'they are'} ignored", file=sys.stderr, flush=True)


def _placement_options() -> PlacementOptions:
    """The placement options the flags give, validated."""
    _refuse_unported()
    return options_from(
        {flag.flag: FLAGS[flag.flag].value for flag in OPTION_FLAGS},
        fusion_path_check="exact" if FLAGS.fusion_check_disjoint_paths else "auto")


def main(argv: list[str]) -> int:
    # All of it under `recording`, TensorFlow's import and the graph's build included: a Ctrl-C
    # at any point is one line and exit status 130, never a traceback.
    # Every file is written whole or not at all (atomic_write).
    return run_main(_main, argv, prog="train", interrupted=_INTERRUPTED,
                    loading_handler=_interrupted_while_loading)


def _main() -> int:
    # Flags and outputs are checked before TensorFlow loads, so that their errors come at once.
    options = _placement_options()
    from baechi_tf.rewriter.devices import resolve_memory

    resolve_memory(FLAGS.memory_per_device)  # _devices reads it again, once TensorFlow is loaded
    _comm_costs()  # and these
    if not math.isfinite(FLAGS.learning_rate):
        raise ConfigError(f"--learning_rate={FLAGS.learning_rate}; give a finite number")
    if FLAGS.only_forward and not FLAGS.colocate_grads_with_ops:
        raise ConfigError(
            "--only_forward places the forward graph and lets each gradient follow its forward "
            "op: add --colocate_grads_with_ops")
    _warn_of_unused_model_flags()
    _check_outputs()
    if FLAGS.costgen and FLAGS.report_dir:
        print("train: --report_dir is not used with --costgen, which profiles and places nothing; "
              "give it to the run that places", file=sys.stderr, flush=True)
    import_tensorflow_quietly()
    import tensorflow as tf
    from absl import logging

    sys.stdout.reconfigure(line_buffering=True)
    tf.get_logger().setLevel("ERROR")
    if not FLAGS["verbosity"].present:  # -v 0 brings back the libraries' INFO logs
        logging.set_verbosity(logging.WARNING)
    config = _config_from_flags()
    setup, session_config, target = _devices()
    _check_data_format(config, setup, target)
    if FLAGS.costgen:
        return costgen(config, setup, session_config, target)
    return place_and_run(config, options, setup, session_config, target)


if __name__ == "__main__":
    app.run(main, flags_parser=flag_parser("train"))
