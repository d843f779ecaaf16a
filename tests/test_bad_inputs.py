"""Bad input across the command line, the graph pass and BaechiSession.

Every case ends with exit status 2 and one line naming the problem and the fix (command line) or
a `BaechiError` subclass (API); nothing is written to the output; the input files are unchanged.
The JSON cases of `place-json` are in test_json_cli.py (26 more).
"""

import hashlib
import os
import pathlib
import pickle
import stat
import threading

import pytest
import tensorflow as tf
from google.protobuf import text_format

from baechi_tf import BaechiSession, PlacementOptions, place_graph_def
from baechi_tf.cli import main
from baechi_tf.cluster import Cluster, GiB
from baechi_tf.cost_model import save_profile
from baechi_tf.errors import BaechiError, ConfigError, InfeasiblePlacementError, ProfileError
from tf_models import build_lstm, profiled_lstm

pytestmark = pytest.mark.tf


class _Trap:
    """Unpickling this writes a marker file: proof that a pickle was (never) loaded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.write_text, (pathlib.Path(self.marker), "unpickled!"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    lstm = profiled_lstm()
    d = tmp_path_factory.mktemp("bad")
    p = {name: d / name for name in ("graph.pb", "graph.pbtxt", "model.meta", "cost.pb", "other.pb")}
    p["graph.pb"].write_bytes(lstm.graph_def.SerializeToString())
    p["graph.pbtxt"].write_text(text_format.MessageToString(lstm.graph_def))
    with lstm.model.graph.as_default():
        p["model.meta"].write_bytes(tf.compat.v1.train.export_meta_graph(graph=lstm.model.graph).SerializeToString())
    save_profile(lstm.profile, p["cost.pb"])
    other = tf.Graph()
    with other.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4], name="x")
        tf.identity(x * 2.0, name="y")
    p["other.pb"].write_bytes(other.as_graph_def().SerializeToString())
    p["marker"] = d / "unpickled.marker"
    p["pickle"] = d / "cost.pkl"
    p["pickle"].write_bytes(pickle.dumps(_Trap(str(p["marker"]))))
    p["dir"] = d
    return lstm, p


def digest(*paths):
    return {str(x): hashlib.sha256(pathlib.Path(x).read_bytes()).hexdigest() for x in paths if pathlib.Path(x).is_file()}


def write(d, name, data):
    path = d / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


# (name, graph file or bytes, profile file or bytes, extra flags, expected message)
CLI_CASES = [
    ("graph missing", "nope.pb", "cost.pb", [], "cannot read|no such|does not exist|not found"),
    ("graph empty", b"", "cost.pb", [], "empty|not a GraphDef|no nodes|does not parse"),
    ("graph truncated", "TRUNC:graph.pb", "cost.pb", [], "GraphDef|parse|truncated"),
    ("graph random bytes", b"\x8f\x01\xff\xfe garbage", "cost.pb", [], "GraphDef|parse"),
    ("graph bad text", b"node { name: 'a' op: ", "cost.pb", [], "GraphDef|parse"),
    ("meta truncated", "TRUNC:model.meta", "cost.pb", [], "GraphDef|MetaGraphDef|parse"),
    ("profile pickle", "graph.pb", "pickle", [], "pickle|not a cost profile|CostProfile"),
    ("profile empty", "graph.pb", b"", [], "empty|not a cost profile|CostProfile"),
    ("profile truncated", "graph.pb", "TRUNC:cost.pb", [], "truncated|not a cost profile|CostProfile"),
    ("profile text", "graph.pb", b"compute_us: 5\n", [], "not a cost profile|CostProfile"),
    ("profile of another graph", "other.pb", "cost.pb", [], "another graph|does not match|allow_profile_mismatch"),
    ("zero devices", "graph.pb", "cost.pb", ["--num_devices", "0"], "at least one device|num_devices"),
    ("negative devices", "graph.pb", "cost.pb", ["--num_devices", "-2"], "at least one device|num_devices"),
    ("bad memory size", "graph.pb", "cost.pb", ["--memory_per_device", "8XB"], "memory"),
    ("zero memory", "graph.pb", "cost.pb", ["--memory_per_device", "0"], "memory|positive"),
    # Not a traceback (OverflowError), nor "not a positive size" for a unit it does not know, nor
    # place-json's field memory_bytes, which the command line has not.
    ("infinite memory", "graph.pb", "cost.pb", ["--memory_per_device", "inf"], "^baechi place: error: --memory_per_device 'inf' is not a finite size; write e.g. '8GiB'"),
    ("infinity memory", "graph.pb", "cost.pb", ["--memory_per_device", "Infinity"], "--memory_per_device 'Infinity' is not a finite size"),
    ("overflowing memory", "graph.pb", "cost.pb", ["--memory_per_device", "1e400"], "--memory_per_device '1e400' is more than a device can hold .2\\*\\*63 - 1 bytes"),
    ("memory past int64", "graph.pb", "cost.pb", ["--memory_per_device", "1e30"], "--memory_per_device '1e30' is more than a device can hold"),
    ("unknown memory unit", "graph.pb", "cost.pb", ["--memory_per_device", "1PiB"], "--memory_per_device '1PiB' has the unknown unit 'PiB'; use KiB, MiB, GiB, TiB, KB, MB, GB, TB or none"),
    ("bad comm coefficients", "graph.pb", "cost.pb", ["--comm_cost_coeffs", "fast,cheap"], "slope,intercept"),
    ("negative comm", "graph.pb", "cost.pb", ["--comm_cost_coeffs=-1,134"], ">= 0"),
    ("memory fraction 0", "graph.pb", "cost.pb", ["--placer_memory_fraction", "0"], r"\(0, 1\]"),
    ("sct threshold 2", "graph.pb", "cost.pb", ["--sct_threshold", "2"], "sct_threshold"),
    ("negative refine time", "graph.pb", "cost.pb", ["--refine_seconds", "-1"], "refine_seconds"),
    ("negative placement jobs", "graph.pb", "cost.pb", ["--placement_jobs", "-1"], "placement_jobs -1 must be a whole number"),
    ("does not fit", "graph.pb", "cost.pb", ["--memory_per_device", "4KiB"], "cannot run on any device"),
    ("single does not fit", "graph.pb", "cost.pb", ["--placement_method", "single", "--memory_per_device", "64KiB"], "does not fit on one device"),
]


def resolve(p, spec, tmp_path, name):
    if isinstance(spec, bytes):
        return write(tmp_path, name, spec)
    if spec.startswith("TRUNC:"):
        data = p[spec[6:]].read_bytes()
        return write(tmp_path, "trunc-" + spec[6:], data[: len(data) // 2])
    return p[spec] if spec in p else tmp_path / spec


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_place_command(files, tmp_path, capsys, case):
    _, p = files
    name, graph_spec, cost_spec, flags, match = case
    graph = resolve(p, graph_spec, tmp_path, "g.bin")
    cost = resolve(p, cost_spec, tmp_path, "c.bin")
    out = tmp_path / "placed.pb"
    before = digest(graph, cost)
    status = main(["place", "--graph", str(graph), "--cost_path", str(cost), "--out", str(out),
                   "--refine_seconds", "0.1", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2, name
    assert err and err[-1].startswith("baechi place: error: "), err
    assert "Traceback" not in "\n".join(err)
    import re

    assert re.search(match, err[-1], re.IGNORECASE), err[-1]
    assert not out.exists()
    assert not any(x.name.startswith(".tmp-") for x in tmp_path.iterdir())
    assert digest(graph, cost) == before
    assert not p["marker"].exists(), "the pickle was unpickled"


@pytest.mark.parametrize("text, size", [
    ("8GiB", 8 << 30), ("512mib", 512 << 20), ("1.5KiB", 1536), ("4096", 4096), ("100B", 100),
    ("1TiB", 1 << 40), ("2TB", 2 * 10**12), ("2 tb", 2 * 10**12), ("1e3", 1000), (".5GiB", 1 << 29),
    ("9223372036854775807", (1 << 63) - 1),  # exact: no rounding through a float
])
def test_memory_sizes_take_every_unit_they_list(text, size):
    from baechi_tf.rewriter.devices import resolve_memory

    assert resolve_memory(text) == size


@pytest.mark.parametrize("where", ["missing folder", "a folder", "trailing slash", "trailing dot"])
@pytest.mark.parametrize("command", ["place", "place-json"])
def test_an_output_that_cannot_be_written_is_refused_before_placing(files, tmp_path, capsys, command, where):
    # A name ending in a separator ("results/", a folder yet to be made) was taken, and the write
    # failed after the placement with NotADirectoryError.
    _, p = files
    out, message = {
        "missing folder": (tmp_path / "missing" / "placed.out", "does not exist; create it first"),
        "a folder": (tmp_path, "is a folder"),
        "trailing slash": (f"{tmp_path / 'results'}{os.sep}", "names a folder, not a file; give the name of a file"),
        "trailing dot": (f"{tmp_path / 'results'}{os.sep}.", "names a folder, not a file; give the name of a file"),
    }[where]
    if command == "place":
        args = ["place", "--graph", str(p["graph.pb"]), "--cost_path", str(p["cost.pb"])]
    else:
        args = ["place-json", str(pathlib.Path(__file__).parents[1] / "examples" / "fork_join.json")]
    status = main([*args, "--out", str(out)])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert status == 2
    assert err[-1].startswith(f"baechi {command}: error: --out "), err
    assert message in err[-1]
    assert "Traceback" not in captured.err
    assert captured.out == ""  # refused before placing: no summary
    assert sorted(x.name for x in tmp_path.iterdir()) == []


def _fifo_reader(path):
    """Makes a FIFO at `path` and reads it in a thread; returns a function that ends the reading
    and gives the bytes read. A writer is held open until then, so the reader sees no end before
    the command writes (nor hangs when it never does)."""
    os.mkfifo(path)
    r = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    w = os.open(path, os.O_WRONLY)
    os.set_blocking(r, True)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(r, 1 << 16), b"")), daemon=True)
    reader.start()

    def done():
        os.close(w)
        reader.join(timeout=60)
        os.close(r)
        return b"".join(chunks)

    return done


@pytest.mark.parametrize("kind", ["fifo", "descriptor link", "character device"])
@pytest.mark.parametrize("command", ["place", "place-json", "save_profile"])
def test_an_output_that_is_not_a_regular_file_is_written_into_and_stays(files, tmp_path, capsys, command, kind):
    # --out /dev/null (as root) became a regular file: the output was written to a temporary
    # file renamed over it; --out /dev/stdout replaced the link. A FIFO, a link to one of the
    # process's descriptors (as /dev/stdout is) and a private null device stand in for them.
    lstm, p = files
    out = tmp_path / "out"
    if kind == "fifo":
        read = _fifo_reader(out)
    elif kind == "descriptor link":
        held = tmp_path / "held"  # what the descriptor writes to, as a shell's `> file`
        fd = os.open(held, os.O_WRONLY | os.O_CREAT, 0o644)
        inode = os.fstat(fd).st_ino
        out.symlink_to(f"/proc/self/fd/{fd}")
    else:
        try:
            os.mknod(out, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a null device of our own
        except OSError:
            pytest.skip("cannot make a device node here (not root, or a nodev mount)")
    kind_of = stat.S_IFMT(os.lstat(out).st_mode)
    if command == "save_profile":  # train.py's --cost_path, BaechiSession(cost_path=...)
        save_profile(lstm.profile, out)
        status = 0
    elif command == "place":
        status = main(["place", "--graph", str(p["graph.pb"]), "--cost_path", str(p["cost.pb"]),
                       "--out", str(out), "--refine_seconds", "0"])
    else:
        example = pathlib.Path(__file__).parents[1] / "examples" / "fork_join.json"
        status = main(["place-json", str(example), "--out", str(out), "--refine_seconds", "0"])
    if kind == "fifo":
        written = read()
    elif kind == "descriptor link":
        written = held.read_bytes()
        assert os.fstat(fd).st_ino == inode and os.fstat(fd).st_size == len(written)
        os.close(fd)
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert stat.S_IFMT(os.lstat(out).st_mode) == kind_of  # still a FIFO, a link, a device
    if kind == "character device":
        return
    assert written and {"place-json": b'"placement"', "place": b"/device:", "save_profile": b""}[command] in written
    assert {x.name for x in tmp_path.iterdir()} <= {"out", "held"}  # no temporary file left


def test_session_refuses_a_cost_path_it_cannot_write(tmp_path):
    model = build_lstm()
    with pytest.raises(ConfigError, match="cost_path .*does not exist; create it first"):
        BaechiSession(graph=model.graph, num_devices=2, cost_path=str(tmp_path / "no" / "cost.pb"))


def test_place_command_flag_errors_exit_2(files, capsys):
    _, p = files
    with pytest.raises(SystemExit) as e:
        main(["place", "--graph", str(p["graph.pb"]), "--cost_path", str(p["cost.pb"]),
              "--placement_method", "m_fast"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# ---------------------------------------------------------------- the graph pass


def cluster(n=2, memory=8 * GiB):
    return Cluster.homogeneous(n, memory, device_type="CPU", prefix="/job:localhost/replica:0/task:0")


def test_graph_pass_refuses_a_pickle_profile(files):
    lstm, p = files
    with pytest.raises(ProfileError):
        place_graph_def(lstm.graph_def, str(p["pickle"]), cluster())
    assert not p["marker"].exists()


def test_graph_pass_refuses_a_directory_as_profile(files):
    lstm, p = files
    with pytest.raises(ProfileError):
        place_graph_def(lstm.graph_def, str(p["dir"]), cluster())


def test_graph_pass_refuses_another_graphs_profile(files):
    lstm, p = files
    other = tf.compat.v1.GraphDef.FromString(p["other.pb"].read_bytes())
    with pytest.raises(ProfileError, match="allow_profile_mismatch"):
        place_graph_def(other, lstm.profile, cluster())


def test_graph_pass_bad_options(files):
    lstm, _ = files
    with pytest.raises(ConfigError, match="unknown placement method"):
        place_graph_def(lstm.graph_def, lstm.profile, cluster(), PlacementOptions("nope"))
    with pytest.raises(ConfigError, match="unknown grouper"):
        place_graph_def(lstm.graph_def, lstm.profile, cluster(), PlacementOptions(grouper="tight"))


def test_graph_pass_arguments_of_the_wrong_type_are_named(files):
    # They raised "TypeError: expected str, bytes or os.PathLike object, not NoneType",
    # "AttributeError: 'list' object has no attribute 'devices'", "... 'str' object has no
    # attribute 'validate'".
    lstm, _ = files
    devices = list(cluster().devices)
    for args, message in [
        ((lstm.graph_def, None, cluster()), r"^profile=None is a NoneType; give a CostProfile or the path of a profile file$"),
        ((lstm.graph_def, lstm.profile, devices), r"^cluster=\[.*\] is a list; give a Cluster \(Cluster\(\[Device"),
        ((lstm.graph_def, lstm.profile, cluster(), "m_etf"), r"^options='m_etf' is a str; give a PlacementOptions"),
    ]:
        with pytest.raises(ConfigError, match=message):
            place_graph_def(*args)


def test_graph_pass_cannot_fit(files):
    lstm, _ = files
    before = lstm.graph_def.SerializeToString()
    with pytest.raises(InfeasiblePlacementError, match="cannot run on any device.*give the devices more memory"):
        place_graph_def(lstm.graph_def, lstm.profile, cluster(2, 4096), PlacementOptions("m_etf"))
    assert lstm.graph_def.SerializeToString() == before


def test_graph_pass_not_a_graph_def(files):
    lstm, _ = files
    with pytest.raises(BaechiError):
        place_graph_def("not a graph", lstm.profile, cluster())


# ---------------------------------------------------------------- BaechiSession


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_devices=0), ConfigError, "at least one device"),
        (dict(num_devices=2, placement_method="m_fast"), ConfigError, "unknown placement method"),
        (dict(num_devices=2, memory_fraction=0), ConfigError, r"fraction"),
        (dict(num_devices=2, memory_fraction=1.5), ConfigError, r"fraction"),
        (dict(num_devices=2, memory_bytes_per_device=0), ConfigError, "memory"),
    ],
    ids=["zero devices", "unknown method", "fraction 0", "fraction 1.5", "zero memory"],
)
def test_session_arguments(kwargs, error, match):
    model = build_lstm()
    with pytest.raises(error, match=match):
        BaechiSession(graph=model.graph, **kwargs)


def test_options_an_lp_solver_or_an_expert_layout_that_cannot_be_are_refused_before_the_first_run():
    # An unknown LP solver was found only when m-SCT ran (a BaechiSession's first run had
    # profiled by then); an expert layout that was no mapping raised AttributeError ('str' object
    # has no attribute 'items').
    model = build_lstm()
    with pytest.raises(ConfigError, match=r"^unknown LP solver 'gurobi'; choose one of auto, mosek, highs, cvxopt$"):
        BaechiSession(graph=model.graph, num_devices=2, options=PlacementOptions(lp_solver="gurobi"))
    with pytest.raises(ConfigError, match=r"^the expert layout must map op names to device names \(strings\)$"):
        PlacementOptions(placement_method="expert", expert="/device:GPU:0").validate()
    from baechi_tf.placer.pipeline import LP_SOLVERS  # named without loading scipy
    from baechi_tf.sct.solvers import SOLVERS

    assert LP_SOLVERS == SOLVERS


def test_session_graph_that_cannot_fit(tmp_path):
    model = build_lstm()
    with BaechiSession(graph=model.graph, num_devices=2, placement_method="m_etf",
                       memory_bytes_per_device=4096) as sess:
        with pytest.raises(InfeasiblePlacementError, match="cannot run on any device.*give the devices more memory"):
            sess.run(model.init)  # the first run of a fetch profiles and places the graph


def test_first_line_gives_the_cause_of_a_tensorflow_session_error():
    # TF 2.21's messages start "Graph execution error:"; warnings that quoted the first line said
    # nothing else. Several causes come as "2 root error(s) found." and then "(0) ...".
    import tensorflow as tf

    from baechi_tf.errors import first_line

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        with tf.device("/cpu:0"):
            a = tf.debugging.check_numerics(x, "bad0")
        with tf.device("/cpu:1"):
            b = tf.debugging.check_numerics(x * 2.0, "bad1")
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
    with tf.compat.v1.Session(graph=g, config=config) as sess:
        with pytest.raises(tf.errors.InvalidArgumentError) as missing:
            sess.run(a)
        with pytest.raises(tf.errors.InvalidArgumentError) as two:
            sess.run([a, b], {x: [float("nan"), 1.0]})
    assert first_line(missing.value).startswith("You must feed a value for placeholder tensor 'x'")
    said = first_line(two.value)
    assert said.startswith("INVALID_ARGUMENT: bad") and "Tensor had NaN values" in said, said
    assert first_line(ValueError("")) == "ValueError"
    assert first_line(ValueError("Graph execution error:\nDetected at node 'x'\n  File f")) == (
        "Detected at node 'x'")
