"""train.py end to end, as subprocesses: --costgen, then placement with each method, on tiny models.

Each run prints the placement time, the simulated and the measured step time; with
--log_placer_device_placement it prints every op's device, and with --logdir it writes the traced
step's RunMetadata, from which the tests check on their own that every op ran where it was placed.
"""

import glob
import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf
from google.protobuf import text_format

import ctrl_c
from loaded import run_listing_modules
from baechi_tf.cost_model import load_profile

pytestmark = pytest.mark.tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK = "/job:localhost/replica:0/task:0"
STANDINS = {f"{TASK}/device:CPU:{i}" for i in range(1, 5)}

GNMT = ["--model_name=gnmt_v2", "--batch_size=4", "--vocab_size=50", "--max_seq_length=3",
        "--rnn_units=8", "--num_layers=2", "--rnn_unit_type=lstm", "--encoder_type=gnmt",
        "--residual", "--num_gpus=4", "--optimizer=adam", "--colocate_grads_with_ops"]
INCEPTION = ["--model_name=inception_v3", "--batch_size=2", "--image_size=75",
             "--depth_multiplier=0.05", "--num_classes=7", "--num_gpus=2", "--optimizer=momentum"]
TRANSFORMER = ["--model_name=transformer", "--batch_size=3", "--vocab_size=40",
               "--max_seq_length=3", "--num_layers=2", "--num_heads=2", "--d_model=8",
               "--d_ff=16", "--num_gpus=2", "--optimizer=sgd"]
FAST_PROFILE = ["--profile_warmup_steps=1", "--profile_steps=2", "--profile_every_n_steps=1"]
FAST_RUN = ["--warmup_steps=1", "--timed_steps=2", "--refine_seconds=0.5"]


def train(*args, expect=0, **env):
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ROOT, capture_output=True,
        text=True, timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env),
    )
    assert done.returncode == expect, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def costgen(tmp_path_factory, model_flags, name):
    path = str(tmp_path_factory.mktemp(name) / "cost.pkl")
    reports = tmp_path_factory.mktemp(name) / "reports"  # the placing run's flags, given here too
    done = train("--costgen", f"--cost_path={path}", *model_flags, *FAST_PROFILE, f"--report_dir={reports}")
    out = done.stdout
    # It was dropped without a word.
    assert "train: --report_dir is not used with --costgen, which profiles and places nothing" in done.stderr
    assert not reports.exists()
    assert re.search(r"^Profile of \d+ ops over 2 traced steps written to ", out, re.M), out
    profile = load_profile(path)  # a protobuf CostProfile, whatever the file is called
    assert profile.num_traced_steps == 2 and len(profile.ops) > 20
    with open(path, "rb") as f:
        assert not f.read(2).startswith(b"\x80")  # not a pickle
    return path, profile


def figure(out, label):
    m = re.search(rf"^{re.escape(label)}: ([0-9.]+) (ms|s)\b", out, re.M)
    assert m, f"no {label!r} line in:\n{out}"
    return float(m.group(1))


def place(cost_path, model_flags, method, tmp_path, *extra, stderr=None, **env):
    """Places and runs; (stdout, placement, where ops ran). `stderr`: a list to append it to."""
    logdir = tmp_path / "logdir"
    done = train(f"--cost_path={cost_path}", *model_flags, f"--placement_method={method}",
                 *FAST_RUN, "--log_placer_device_placement", f"--logdir={logdir}", *extra, **env)
    out = done.stdout
    if stderr is not None:
        stderr.append(done.stderr)
    assert figure(out, "Entire placement time") > 0
    assert figure(out, "Simulated step time") > 0
    assert figure(out, "Average step time (measured)") > 0
    assert re.search(r"^makespan \(simulated\)\s+[0-9.]+ ms$", out, re.M), out  # the summary
    m = re.search(r"^Ops that ran where placed: (\d+) of (\d+); elsewhere: 0$", out, re.M)
    assert m and m.group(1) == m.group(2) and int(m.group(1)) > 20, out
    m = re.search(r"^Traced step: \d+ ops ran on (1 device|([2-9]|\d\d+) devices) \(", out, re.M)
    assert m, out  # not "1 devices"
    placement = dict(re.findall(r"^(\S+): (/job:\S+)$", out, re.M))
    traced = glob.glob(str(logdir / "run_metadata-placed-*.pbtxt"))
    assert len(traced) == 1, traced
    metadata = text_format.Parse(open(traced[0]).read(), tf.compat.v1.RunMetadata())
    ran = {}
    for dev in metadata.step_stats.dev_stats:
        for node in dev.node_stats:
            if node.node_name in placement:
                ran[node.node_name] = dev.device
    return out, placement, ran


def check_ran_as_placed(placement, ran, profile, not_run=()):
    """Every op that ran in the traced step ran on its placed device, and every profiled op ran
    (but constants, which the executor does not always trace, and `not_run`)."""
    wrong = {n: (ran[n], placement[n]) for n in ran if ran[n] != placement[n]}
    assert not wrong, list(wrong.items())[:5]
    must = {n for n, c in profile.ops.items() if c.op_type != "Const"} - set(not_run)
    assert len(must) > 20 and not must - set(ran), sorted(must - set(ran))[:5]


@pytest.fixture(scope="module")
def gnmt_profile(tmp_path_factory):
    return costgen(tmp_path_factory, GNMT, "gnmt")


@pytest.mark.parametrize("method", ["m_topo", "m_etf", "m_sct", "auto", "single", "expert"])
def test_gnmt_each_method_places_and_runs_where_placed(gnmt_profile, method, tmp_path):
    path, profile = gnmt_profile
    out, placement, ran = place(path, GNMT, method, tmp_path)
    # The training graph was placed whole, and every op ran on its device.
    assert set(profile.ops) <= set(placement)
    assert set(placement.values()) <= STANDINS
    check_ran_as_placed(placement, ran, profile)
    used = set(placement.values())
    if method == "single":
        assert len(used) == 1
    elif method == "expert":
        # GNMT's round-robin: L=2 layers on devices 0 and 1, projection and loss on L % G = 2.
        assert used == {f"{TASK}/device:CPU:{i}" for i in (1, 2, 3)}
        assert placement["decoder/layer_1/t0/colocation"] == f"{TASK}/device:CPU:2"
        assert placement["loss/loss"] == f"{TASK}/device:CPU:3"
    elif method in ("m_topo", "m_etf", "m_sct"):
        assert re.search(rf"^method\s+{method}\b", out, re.M), out
        assert len(used) > 1


def test_the_seeds_placement_flags_and_the_originals_unused_ones(gnmt_profile, tmp_path):
    # The README's (the original's) placement command, with flags of the original that are
    # accepted: --fusion_check_disjoint_paths asks fusion for exact path checks, the others are
    # unused there too.
    path, profile = gnmt_profile
    err = []
    out, placement, ran = place(
        path, GNMT, "m_etf", tmp_path, "--placer_type=fusion", "--grouper=coplace",
        "--comm_cost_coeffs=0.0001754,134", "--memory_fraction=1.0", "--fusion_check_disjoint_paths",
        "--stats_path=/nonexistent/stats.log", "--device_info_path=/nonexistent/info.json",
        "--grappler_time=10", "--resolve_cycle", "--verbosity=0", stderr=err,
    )
    fused = re.search(r"fusion \(exact path check\): (\d+) ops into (\d+)", err[0])
    assert fused and int(fused.group(2)) < int(fused.group(1)), err[0][-3000:]
    check_ran_as_placed(placement, ran, profile)
    assert re.search(r"^method\s+m_etf\b", out, re.M), out
    assert len(set(placement.values())) > 1


def test_comm_auto_fits_the_link_on_the_stand_ins_and_places_with_it(gnmt_profile, tmp_path):
    path, profile = gnmt_profile
    out, placement, ran = place(path, GNMT, "m_etf", tmp_path, "--comm_cost_coeffs=auto",
                                "--comm_cost_factor=2")
    fitted = re.search(r"^train: link fitted \(--comm_cost_coeffs=auto\): (\S+) us/B x \+ (\S+) us, "
                       rf"{TASK}/device:CPU:1 -> {TASK}/device:CPU:2, 20 sizes, .*CPU stand-ins in one "
                       "process", out, re.M)
    assert fitted, out
    link = re.search(r"^link\s+(\S+) us/B x \+ (\S+) us$", out, re.M)  # the summary's
    assert link, out
    for fit, used in zip(fitted.groups(), link.groups()):  # doubled by --comm_cost_factor
        assert float(used) == pytest.approx(2 * float(fit), rel=1e-3)
    check_ran_as_placed(placement, ran, profile)


def test_lp_time_limit_reaches_the_placer(gnmt_profile):
    # A limit HiGHS cannot meet, with HiGHS named: the placement stops with the limit's error.
    path, _ = gnmt_profile
    done = train(f"--cost_path={path}", *GNMT, "--placement_method=m_sct", "--lp_solver=highs",
                 "--lp_time_limit=1e-9", *FAST_RUN, expect=2)
    assert "within --lp_time_limit=1e-09 s" in done.stderr, done.stderr[-2000:]


def test_gnmt_only_forward_places_forward_ops_and_gradients_follow(tmp_path_factory, tmp_path):
    flags = GNMT + ["--only_forward"]
    path, profile = costgen(tmp_path_factory, flags, "gnmt_forward")
    assert not any(n.startswith(("gradients/", "Adam")) for n in profile.ops)
    out, placement, ran = place(path, flags, "m_etf", tmp_path)
    assert not any(n.startswith("gradients/") for n in placement)  # only forward ops placed
    assert re.search(r"^Training ops built after placement: \d+ more ops", out, re.M), out
    # The training step runs every profiled forward op but the loss's last division, whose
    # output no gradient needs.
    check_ran_as_placed(placement, ran, profile, not_run=["loss/loss"])
    # Each gradient op of a step's LSTM cell (a colocation group; the concatenation that makes
    # its input is outside the group) ran on the device of that cell.
    metadata = text_format.Parse(
        open(glob.glob(str(tmp_path / "logdir" / "run_metadata-placed-*.pbtxt"))[0]).read(),
        tf.compat.v1.RunMetadata())
    cell = "gradients/decoder/layer_1/t0/"
    grads = {n.node_name: d.device for d in metadata.step_stats.dev_stats for n in d.node_stats
             if n.node_name.startswith(cell) and not n.node_name.startswith(cell + "input")}
    assert grads
    assert set(grads.values()) == {placement["decoder/layer_1/t0/colocation"]}
    # Placed without --only_forward, the forward profile was "taken on another graph; profile this
    # graph again": the flag is the fix, not a new profile.
    done = train(f"--cost_path={path}", *GNMT, "--placement_method=m_etf", expect=2)
    assert done.stderr == (
        f"train: error: the cost profile {path!r} is of the forward graph only (profiled with "
        "--only_forward): add --only_forward, as when it was profiled\n")


def test_a_cost_factor_that_makes_the_step_too_long_is_named(gnmt_profile):
    # It was "step 'import' failed: the ops' compute times add up to 4.76e+303 us, ... check that
    # they are in microseconds": they were; the factor made them so.
    path, _ = gnmt_profile
    done = train(f"--cost_path={path}", *GNMT, "--comm_cost_coeffs=0,0", "--cost_factor=1e300", expect=2)
    assert re.fullmatch(r"train: error: --cost_factor=1e\+300 makes the profile's \S+ us of compute per "
                        r"step more than the 1e\+15 us \(31 years\) a step may take; give a smaller "
                        r"factor\n", done.stderr), done.stderr


def test_the_inter_host_line_without_a_cluster_is_said_to_be_unused(tmp_path):
    # It was dropped without a word. (The folder given as the profile ends the run once said.)
    done = train(f"--cost_path={tmp_path}", "--inter_host_comm_cost_coeffs=0.001,500", expect=2,
                 TF_CONFIG="")
    assert done.stderr.splitlines() == [
        "train: --inter_host_comm_cost_coeffs is not used: every device is on this host (give "
        "--cluster_spec, or TF_CONFIG, to run across hosts)",
        f"train: error: cost profile {str(tmp_path)!r} is a directory; give a file"], done.stderr


def test_a_profile_of_the_training_graph_placed_with_only_forward_says_so(gnmt_profile):
    path, _ = gnmt_profile
    done = train(f"--cost_path={path}", *GNMT, "--only_forward", "--placement_method=m_etf", expect=2)
    assert done.stderr == (
        f"train: error: the cost profile {path!r} is of the whole training graph (profiled without "
        "--only_forward): leave out --only_forward, as when it was profiled\n")


def test_inception_v3_in_nchw_keeps_each_max_pool_gradient_with_its_pool(tmp_path_factory, tmp_path):
    # Split from its MaxPool, an NCHW MaxPoolGrad failed the first step on CPU devices: "Default
    # MaxPoolingGradOp only supports NHWC on device type CPU" (HEFT, m-SCT and m-TOPO
    # placements of a small Inception-v3). oneDNN's kernels, which take NCHW, are turned on.
    nchw = [f for f in INCEPTION if not f.startswith("--num_gpus")] + ["--num_gpus=4", "--data_format=NCHW"]
    onednn = {"TF_ENABLE_ONEDNN_OPTS": "1"}
    path = str(tmp_path_factory.mktemp("inception_nchw") / "cost.pb")
    train("--costgen", f"--cost_path={path}", *nchw, *FAST_PROFILE, **onednn)
    out, placement, ran = place(path, nchw, "heft", tmp_path, **onednn)
    grads = [n for n in placement if n.endswith("_grad/MaxPoolGrad")]
    assert len(grads) >= 3
    for grad in grads:
        pool = grad.replace("gradients/", "", 1).replace("_grad/MaxPoolGrad", "")
        assert placement[grad] == placement[pool], grad
    assert len(set(placement.values())) == 4  # spread, not on one device


def test_inception_v3_costgen_then_m_etf(tmp_path_factory, tmp_path):
    path, profile = costgen(tmp_path_factory, INCEPTION, "inception")
    out, placement, ran = place(path, INCEPTION, "m_etf", tmp_path)
    assert set(placement.values()) <= {f"{TASK}/device:CPU:{i}" for i in (1, 2)}
    check_ran_as_placed(placement, ran, profile)
    assert "InceptionV3/Mixed_7c/Branch_3/Conv2d_0b_1x1/Conv2D" in ran


def test_transformer_costgen_then_auto_with_reports(tmp_path_factory, tmp_path):
    path, profile = costgen(tmp_path_factory, TRANSFORMER, "transformer")
    reports = tmp_path / "reports"
    out, placement, ran = place(path, TRANSFORMER, "auto", tmp_path, f"--report_dir={reports}")
    check_ran_as_placed(placement, ran, profile)
    assert re.search(r"^method\s+auto\(", out, re.M), out
    assert {"gantt.png", "summary.json", "trace.json", "graph.pbtxt"} <= set(os.listdir(reports))
    # The trace holds TF's timeline of the traced placed step beside the simulated one: the ops
    # TF ran there, on the devices they ran on.
    events = json.loads((reports / "trace.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    tf_pids = {pid for pid, name in names.items() if name.startswith("TensorFlow ")}
    assert tf_pids and min(tf_pids) > 1000
    on_tf = {(e["args"]["op"], names[e["pid"]]) for e in events if e["pid"] in tf_pids and e["ph"] == "X"}
    assert {op for op, _ in on_tf} >= set(ran)
    assert all(names_device.endswith(ran[op]) for op, names_device in on_tf if op in ran)


def test_reports_are_written_before_the_placed_run_and_stay_when_it_is_stopped(gnmt_profile, tmp_path):
    # They were written after the run: one that ran out of memory, or a Ctrl-C during a long
    # timed run, left none, though the placement they show was made.
    path, _ = gnmt_profile
    reports = tmp_path / "reports"
    command = [sys.executable, os.path.join(ROOT, "train.py"), f"--cost_path={path}", *GNMT,
               "--placement_method=m_etf", "--warmup_steps=0", "--timed_steps=300",
               f"--report_dir={reports}"]
    status, seen, err = ctrl_c.after_output(
        command, lambda out: "Reports written to" in out, cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert status == 130, err
    assert "Average step time (measured)" not in seen  # written before the run, not after it
    assert err.endswith("train: interrupted; no partial file was written\n"), err
    names = set(os.listdir(reports))
    assert {"gantt.png", "memory_0.png", "summary.json", "trace.json", "graph.pbtxt"} <= names, names
    assert json.loads((reports / "summary.json").read_text())["method"] == "m_etf"
    events = json.loads((reports / "trace.json").read_text())["traceEvents"]
    assert not [e for e in events if e["pid"] > 1000]  # no TF timeline: the run did not get there
    assert not [n for n in names if n.startswith(".tmp")]


def test_one_step_is_counted_as_one_step(tmp_path):
    # 'mean of 1 untraced steps', 'over 1 traced steps', 'mean of 1 steps'.
    cost = str(tmp_path / "cost.pb")
    out = train("--costgen", f"--cost_path={cost}", *TRANSFORMER, "--profile_warmup_steps=0",
                "--profile_steps=2", "--profile_every_n_steps=2").stdout
    assert re.search(r"^Original runtime: [0-9.]+ ms per step \(mean of 1 untraced step\)$", out, re.M), out
    assert re.search(r"^Profile of \d+ ops over 1 traced step written to ", out, re.M), out
    out = train(f"--cost_path={cost}", *TRANSFORMER, "--placement_method=single", "--warmup_steps=0",
                "--timed_steps=1").stdout
    assert re.search(r"^Average step time \(measured\): [0-9.]+ ms \(mean of 1 step\)$", out, re.M), out


def test_a_profile_of_other_flags_is_refused(gnmt_profile):
    path, _ = gnmt_profile
    flags = [f for f in GNMT if not f.startswith("--rnn_units")] + ["--rnn_units=16"]
    done = train(f"--cost_path={path}", *flags, "--placement_method=m_etf", expect=2)
    assert done.stderr.count("\n") == 1 and "taken on another graph" in done.stderr, done.stderr
    assert "--allow_profile_mismatch" in done.stderr  # the fix it names is a flag train.py has
    done = train(f"--cost_path={path}", *flags, "--placement_method=m_etf", *FAST_RUN,
                 "--allow_profile_mismatch")
    assert re.search(r"^profile mismatch \(allowed\): ", done.stdout, re.M), done.stdout
    assert figure(done.stdout, "Average step time (measured)") > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model_name=resnet"], "model_name"),
        (["--num_gpus=0"], "num_gpus"),
        (["--bogus_flag=1"], "bogus_flag"),
        (["--only_forward"], "--colocate_grads_with_ops"),
        (["--placement_method=magic"], "unknown placement method 'magic'"),
        (["--placement_jobs=-2"], "placement_jobs -2 must be a whole number >= 0"),
        (["--memory_per_device=inf"], "--memory_per_device 'inf' is not a finite size"),  # was OverflowError
        (["--learning_rate=nan"], "--learning_rate=nan; give a finite number"),  # trained with NaN
        (["--memory_per_device=2PB"], "--memory_per_device '2PB' has the unknown unit 'PB'; use KiB"),
        (["--costgen", "--cost_path=/nonexistent/cost.pkl"], "'/nonexistent' does not exist"),
        # A blank path named a folder ' ' in the working directory.
        (["--report_dir= "], "--report_dir=' ' is blank; give a path, or leave the flag out"),
        (["--logdir=  "], "--logdir='  ' is blank; give a path"),
        (["--costgen", "--cost_path= "], "--cost_path=' ' is blank"),
        (["--cost_path="], "--cost_path is empty; give the profile's path"),
        (["--cost_path=/nonexistent/cost.pb"],
         "cost profile '/nonexistent/cost.pb' does not exist; make it first: the same flags with --costgen"),
        # Refused after the profiling, with NotADirectoryError.
        (["--costgen", "--cost_path=results/", *GNMT, *FAST_PROFILE], "'results/' names a folder, not a file"),
        # The original's flags for what is not ported: named, with what to do instead.
        (["--placement_method=m_etf_reserve"], "'m_etf_reserve' is the original's, not ported"),
        (["--placement_method=m_sct_reserve"], "Use m_sct"),
        (["--grappler"], "--grappler is not supported: Grappler's hierarchical RL placer"),
        (["--fusion_allow_cycle"], "--fusion_allow_cycle is not supported"),
        (["--only_important_ops"], "--only_important_ops is not supported"),
        (["--adjustment_method=memory"], "adjuster is not ported"),
        (["--adjustment_with_memory_limit"], "--adjustment_with_memory_limit is not supported"),
        # They worked in the original and were absl's "value should be one of <...>", saying nothing
        # of why.
        (["--placer_type=colocation"], "--placer_type=colocation is the original's ColocationGraphPlacer, "
         "not ported (it was broken there); every placer here keeps TF's colocation groups: use "
         "--placer_type=default or --placer_type=fusion"),
        (["--model_name=cifarnet"], "--model_name=cifarnet is the original's, not ported: choose one of "
         "gnmt_v2, gnmt, inception_v3, transformer"),
        (["--model_name=attention_nmt"], "--model_name=attention_nmt is the original's, not ported"),
        # The communication flags: named, the line said only 'communication slope_us_per_byte'
        # (two flags give one), and an infinite factor passed the check '> 0'.
        (["--comm_cost_coeffs=-1,5"],
         "--comm_cost_coeffs='-1,5': communication slope_us_per_byte=-1.0; it must be a finite number >= 0"),
        (["--inter_host_comm_cost_coeffs=1,nan"], "--inter_host_comm_cost_coeffs='1,nan': communication"),
        (["--comm_cost_coeffs=0.1"], "--comm_cost_coeffs='0.1': communication cost '0.1' is not"),
        (["--cost_factor=inf"], "--cost_factor=inf must be a finite number > 0"),
        # It was 'memory fraction 0.0 must be in (0, 1]', as if --memory_fraction were wrong; then
        # '--placer_memory_fraction=0.0 must be in (0, 1]', where baechi place said it otherwise.
        (["--placer_memory_fraction=0"], "--placer_memory_fraction=0 must be in (0, 1]: the share of each "
         "device's memory the placer may fill (1 fills it all)\n"),
        (["--comm_cost_factor=0"], "--comm_cost_factor=0.0 must be a finite number > 0"),
        (["--cost_factor=1e300"],
         "--comm_cost_factor=1 times --cost_factor=1e+300 makes --comm_cost_coeffs='0.0001754,134' a copy "
         "of more than the 1e+15 us (31 years) a step may take; give smaller factors"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(args, message):
    done = train(*args, expect=2)
    assert done.stderr.startswith("train: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr



def test_model_flags_the_model_has_no_use_for_are_named():
    # They were dropped without a word: --rnn_units=64 kept the Transformer's width.
    done = train("--model_name=transformer", "--rnn_units=64", "--image_size=32", "--num_layers=2",
                 "--num_gpus=2", "--cost_path=/nonexistent/cost.pb", expect=2)
    assert done.stderr.splitlines() == [
        "train: transformer has no use for --rnn_units, --image_size; they are ignored",
        "train: error: cost profile '/nonexistent/cost.pb' does not exist; make it first: the same "
        "flags with --costgen",
    ]
    done = train("--model_name=inception_v3", "--disable_nmt_colocation", "--cost_path=/nonexistent/cost.pb",
                 expect=2)
    assert done.stderr.startswith("train: inception_v3 has no use for --disable_nmt_colocation; it is ignored\n")
    done = train("--model_name=gnmt", "--disable_nmt_colocation", "--rnn_units=8",
                 "--cost_path=/nonexistent/cost.pb", expect=2)
    assert done.stderr.count("\n") == 1, done.stderr  # GNMT takes both


def test_nchw_where_the_cpu_kernels_refuse_it_is_one_line_before_any_work(tmp_path):
    path = tmp_path / "cost.pkl"
    done = train("--costgen", f"--cost_path={path}", *INCEPTION, "--data_format=NCHW", expect=2,
                 TF_ENABLE_ONEDNN_OPTS="0")  # TF's own CPU kernels take NHWC images only
    assert done.stderr == (
        "train: error: --data_format=NCHW: this machine's CPU kernels convolve and pool NHWC images "
        "only (TensorFlow's oneDNN kernels, which take NCHW, are off here); give --data_format=NHWC, "
        "or set TF_ENABLE_ONEDNN_OPTS=1\n")
    assert not path.exists()


@pytest.mark.parametrize("flag", ["--help", "--helpfull"])
def test_help_is_printed_with_exit_status_0(flag):
    # absl's own --help exits with 1: scripts that check the status saw a failure.
    done = train(flag, expect=0)
    assert "--placement_method" in done.stdout and not done.stderr.strip(), done.stderr


@pytest.mark.parametrize("args, status", [
    (["--help"], 0),
    (["--model_name=resnet"], 2),
    (["--placement_method=m_etf_reserve"], 2),
    (["--memory_per_device=1e400"], 2),
    (["--report_dir=/dev/null"], 2),
    (["--cost_path={tmp}/missing.pb"], 2),  # was said after TensorFlow had loaded (8 s)
    # These three too (the path exists: a missing profile is refused first).
    (["--comm_cost_coeffs=abc", "--cost_path={tmp}"], 2),
    (["--cost_factor=inf", "--cost_path={tmp}"], 2),
    (["--memory_fraction=0", "--cost_path={tmp}"], 2),
    (["--costgen", "--cost_path=results/", *GNMT, *FAST_PROFILE], 2),
    (["--costgen", "--cost_path={tmp}/same", "--logdir={tmp}/same", *GNMT, *FAST_PROFILE], 2),
])
def test_help_and_flag_errors_come_before_tensorflow_loads(tmp_path, args, status):
    args = [a.format(tmp=tmp_path) for a in args]
    done, loaded = run_listing_modules(
        [sys.executable, os.path.join(ROOT, "train.py"), *args], tmp_path, cwd=ROOT, timeout=120,
    )
    assert done.returncode == status, done.stderr
    assert "tensorflow" not in loaded

@pytest.mark.parametrize(
    "args, message",
    [
        (["--costgen", "--logdir={file}"], "--logdir '{file}' is a file, not a folder"),
        (["--logdir={file}"], "--logdir '{file}' is a file, not a folder"),
        (["--report_dir={file}"], "--report_dir '{file}' is a file, not a folder"),
        (["--report_dir={file}/reports"], "'{file}' is a file, so the folder cannot be created"),
        # It said "the folder '{file}' does not exist; create it first": it exists, as a file.
        (["--costgen", "--cost_path={file}/cost.pb"],
         "--cost_path '{file}/cost.pb': '{file}' is a file, not a folder; write elsewhere"),
        (["--costgen", "--cost_path={file}/deeper/cost.pb"],
         "--cost_path '{file}/deeper/cost.pb': '{file}' is a file, so the folder '{file}/deeper' cannot "
         "be created; write elsewhere"),
        # --costgen wrote the profile over the folder --logdir had made, after the profiling.
        (["--costgen", "--logdir={cost}"],
         "--logdir '{cost}' and --cost_path '{cost}' name the same path; give --logdir a folder of its own"),
        (["--costgen", "--logdir={cost}/logs"],
         "--logdir '{cost}/logs' is inside --cost_path '{cost}', which is written as a file; give --logdir "
         "a folder elsewhere"),
    ],
)
def test_an_output_folder_that_cannot_be_written_is_refused_before_any_work(tmp_path, args, message):
    # Refused at once, before TensorFlow loads: not after profiling or placing and timing, in a
    # traceback. (Root writes in read-only folders: a file in the way is what a test can make.)
    file = tmp_path / "taken"
    file.write_text("")
    cost = tmp_path / "cost.pb"  # placement checks its outputs before it reads the profile
    done = train(f"--cost_path={cost}", *GNMT, *(a.format(file=file, cost=cost) for a in args), expect=2)
    assert done.stderr.startswith("train: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert message.format(file=file, cost=cost) in done.stderr
    assert done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_costgen_does_not_write_over_a_file_that_is_not_a_profile(tmp_path):
    # --cost_path=model.py (a typo) was profiled into, the source lost without a word.
    source = tmp_path / "model.py"
    source.write_text("import tensorflow as tf\n")
    done, loaded = run_listing_modules(
        [sys.executable, os.path.join(ROOT, "train.py"), "--costgen", f"--cost_path={source}", *GNMT],
        tmp_path, cwd=ROOT, timeout=120,
    )
    assert done.returncode == 2 and done.stderr == (
        f"train: error: --cost_path {str(source)!r} is a file that is not a cost profile (it does not "
        "start as one, nor as the original's pickle), and --costgen would write over it; give another "
        "path, or remove the file first\n"), done.stderr
    assert "tensorflow" not in loaded
    assert source.read_text() == "import tensorflow as tf\n"


def test_a_report_folder_holding_files_of_the_users_is_refused_before_tensorflow_loads(tmp_path):
    # The user's graph.pbtxt in --report_dir was replaced by the report's, after the whole run.
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "graph.pbtxt").write_text("mine")
    done, loaded = run_listing_modules(
        [sys.executable, os.path.join(ROOT, "train.py"), f"--cost_path={tmp_path / 'cost.pb'}", *GNMT,
         f"--report_dir={reports}"], tmp_path, cwd=ROOT, timeout=120,
    )
    assert done.returncode == 2 and done.stderr == (
        f"train: error: --report_dir {str(reports)!r} holds 'graph.pbtxt', not from an earlier report, which "
        "a report would replace; write the reports into another folder, or remove it\n")
    assert "tensorflow" not in loaded
    assert os.listdir(reports) == ["graph.pbtxt"] and (reports / "graph.pbtxt").read_text() == "mine"


def test_a_cost_file_that_is_not_a_profile_is_refused(tmp_path):
    import pickle

    bad = tmp_path / "cost.pkl"
    bad.write_bytes(pickle.dumps({"graphdef": None, "cost_dict": {}}))
    for path in (bad, tmp_path / "missing.pkl"):
        done = train(f"--cost_path={path}", *GNMT, "--placement_method=m_etf", expect=2)
        assert done.stderr.startswith("train: error: ") and done.stderr.count("\n") == 1, done.stderr
        assert str(path) in done.stderr


@pytest.mark.distributed
def test_costgen_and_placement_across_two_local_workers(tmp_path):
    """train.py --cluster_spec: profile and place on the devices of two worker processes."""
    from baechi_tf.rewriter.distributed import start_local_workers

    with start_local_workers(2, 2) as workers:
        spec = workers.spec.to_json()
        flags = [f for f in GNMT if not f.startswith("--num_gpus")] + [
            f"--cluster_spec={spec}", "--num_gpus=2", "--inter_host_comm_cost_coeffs=0.001,500"]
        cost = str(tmp_path / "cost.pb")
        train("--costgen", f"--cost_path={cost}", *flags, *FAST_PROFILE)
        out = train(f"--cost_path={cost}", *flags, "--placement_method=m_topo", *FAST_RUN,
                    f"--logdir={tmp_path / 'logdir'}").stdout
    assert "/job:worker/replica:0/task:1/" in out, out
    assert figure(out, "Average step time (measured)") > 0
    # Each task's CPU:1 was 'device:CPU:1': the counts named two devices alike.
    m = re.search(r"^Traced step: \d+ ops ran on \d+ devices \((.*)\)$", out, re.M)
    assert m, out
    names = [part.rsplit(" ", 1)[0] for part in m.group(1).split(", ")]
    assert len(names) == len(set(names)) and all(n.startswith("/job:worker/") for n in names), names
    assert re.search(r"^Ops that ran where placed: (\d+) of \1; elsewhere: 0$", out, re.M), out


def test_ctrl_c_during_profiling_writes_no_profile(tmp_path):
    import signal

    cost = tmp_path / "cost.pb"
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "train.py"), "--costgen", f"--cost_path={cost}", *GNMT,
         "--profile_warmup_steps=1", "--profile_steps=100000", "--profile_every_n_steps=5"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen = ""
    while "profiling" not in seen:  # the progress of the profiled steps has started
        line = proc.stderr.readline()
        assert line, seen
        seen += line
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, seen + err
    assert "interrupted; no partial file was written" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module", [
    "baechi_tf",  # train.py's own imports, before main
    "tensorflow",  # TensorFlow's import, in main
    "baechi_tf.models",  # the graph's build, after TensorFlow's import
])
def test_ctrl_c_during_start_up_is_one_line(tmp_path, module):
    # A Ctrl-C when train.py first imports `module`: at a known point of the start-up.
    cost = tmp_path / "cost.pb"
    done = ctrl_c.at_import(module, os.path.join(ROOT, "train.py"), "--costgen", f"--cost_path={cost}",
                            *GNMT, *FAST_PROFILE, cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 130, done.stderr[-3000:]
    assert done.stderr == "train: interrupted; no partial file was written\n", done.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []
