"""bench/flags.py and the bench scripts' flags: every flag is explained by --help, and a bad value
ends the script with one line and exit status 2 before any work."""

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def unexplained_flags(help_text):
    """The options of an argparse --help whose entry has no text beside or below it."""
    lines = help_text.split("options:\n", 1)[1].splitlines()
    unexplained = []
    for i, line in enumerate(lines):
        entry = re.match(r"^  (-\S.*?)(?:\s{2,}(\S.*))?$", line)
        if entry and entry.group(2) is None:
            below = lines[i + 1] if i + 1 < len(lines) else ""
            if not re.match(r"^\s{6,}\S", below):
                unexplained.append(entry.group(1))
    return unexplained


@pytest.mark.parametrize("script", ["auto_jobs.py", "emulation_cost.py", "emulation_grid.py", "fidelity.py", "fidelity_memory.py", "fidelity_memory_resim.py", "fidelity_time.py", "host_pins.py", "keras_graphs.py",
                                    "keras_sweep.py", "control_edges.py", "lp_scaling.py", pytest.param("make_profiles.py", marks=pytest.mark.tf),
                                    "placement_scaling.py", "placement_speed.py", "profile_under_load.py", "quality.py",
                                    "reports_scaling.py", "run_overhead.py", "scale.py", "tight_memory.py"])
def test_help_explains_every_flag(script):
    # --sizes, --methods, --refine_seconds, --ops, --out_dir, ... were listed without a word.
    done = bench(script, "--help")
    assert done.returncode == 0, done.stderr
    assert unexplained_flags(done.stdout) == [], done.stdout


def test_the_check_of_help_text_finds_a_flag_without_one():
    text = "usage: x\n\noptions:\n  -h, --help  show this\n  --sizes SIZES\n  --quick     the rest\n"
    assert unexplained_flags(text) == ["--sizes SIZES"]


METHODS = "auto, expert, heft, layers, m_etf, m_sct, m_topo, m_topo_nonuniform, packed, single"


@pytest.mark.parametrize("script, args, message", [
    # A table of rows that each said "failed: KeyError: 'm_etff'", exit status 0.
    ("placement_scaling.py", ["--methods", "m_etff", "--sizes", "100"],
     f"--methods 'm_etff': unknown method(s) m_etff; choose from {METHODS}"),
    # Tracebacks: ValueError: invalid literal for int() with base 10: 'abc'.
    ("placement_scaling.py", ["--sizes", "abc"],
     "--sizes 'abc': give op counts of at least 1, separated by commas, such as 1000,10000"),
    ("lp_scaling.py", ["--sizes", "1000,x"],
     "--sizes '1000,x': give op counts of at least 1, separated by commas, such as 1000,10000"),
    ("auto_jobs.py", ["--layered", "abc"],
     "--layered 'abc': give op counts of at least 1, separated by commas, such as 1000,10000"),
    # A row that failed with ZeroDivisionError, and one per size with "num_devices=0".
    ("placement_scaling.py", ["--sizes", "0"],
     "--sizes '0': give op counts of at least 1, separated by commas, such as 1000,10000"),
    ("placement_scaling.py", ["--devices", "0"], "--devices=0: give at least one device"),
    # A table of dashes, every method having failed on the ConfigError, exit status 0.
    ("quality.py", ["--refine_seconds", "-1"],
     "--refine_seconds: refine_seconds -1.0 must be a finite number >= 0"),
    ("host_pins.py", ["--methods", "auto,m_etff"],
     f"--methods 'auto,m_etff': unknown method(s) m_etff; choose from {METHODS}"),
    # A traceback: baechi_tf.errors.BaechiError: cannot read 'nofile.json'.
    ("auto_jobs.py", ["/nonexistent/nofile.json"],
     "cannot read '/nonexistent/nofile.json': No such file or directory"),
    ("auto_jobs.py", ["--repeats", "0"], "--repeats=0: give at least 1"),
    # After building the graphs, each command's line said "exit 2: ... invalid choice".
    ("scale.py", ["--methods", "m_etff", "--ops", "100"],
     f"--methods 'm_etff': unknown method(s) m_etff; choose from {METHODS}"),
    ("scale.py", ["--ops", "0"], "--ops=0: give at least 1"),
    ("reports_scaling.py", ["--devices", "x"], "--devices 'x': give device counts of at least 1, separated by commas"),
    ("tight_memory.py", ["--methods", ","],
     f"--methods ',': unknown method(s) none given; choose from {METHODS}"),
    ("control_edges.py", ["--methods", "m_etff"],
     "--methods 'm_etff': unknown method(s) m_etff; choose from m_topo, m_etf, m_sct, auto"),
    ("keras_sweep.py", ["--steps", "1"], "argument --steps: '1': give a whole number of at least 2"),
    ("profile_under_load.py", ["--graphs", "rnn,lstm"],
     "--graphs 'rnn,lstm': unknown graph(s) lstm; choose from gnmt_v2, inception_v3, transformer, resnet50, "
     "mobilenetv2, rnn"),
    ("keras_graphs.py", ["--models", "densenet"],
     "--models 'densenet': unknown model(s) densenet; choose from densenet121, resnet50, mobilenetv2, nasnetmobile, "
     "gnmt_v2"),
    ("placement_speed.py", ["--repeats", "0"], "argument --repeats: '0': give a whole number of at least 1"),
    ("emulation_cost.py", ["--graphs", "densenet"],
     "--graphs 'densenet': unknown graph(s) densenet; choose from densenet121, resnet50, mobilenetv2, nasnetmobile, "
     "gnmt_v2"),
    ("run_overhead.py", ["--models", "nasnet"],
     "--models 'nasnet': unknown model(s) nasnet; choose from resnet50, densenet121, nasnetmobile, gnmt_v2"),
    ("run_overhead.py", ["--rounds", "0"], "argument --rounds: '0': give a whole number of at least 1"),
    ("placement_speed.py", ["--scale", "2"], "argument --scale: '2': give a number in (0, 1]"),
    ("fidelity_memory.py", ["--models", "resnet"],
     "--models 'resnet': unknown model(s) resnet; choose from gnmt_v2, inception_v3, transformer, resnet50, "
     "mobilenetv2, rnn"),
    ("fidelity_memory.py", ["--tight", "0"], "--tight=0.0: give a number above 0"),
    ("fidelity_memory.py", ["--tight_methods", "m_etff"],
     f"--tight_methods 'm_etff': unknown method(s) m_etff; choose from {METHODS}"),
    ("fidelity_memory_tasks.py", ["--tasks", "1"], "argument --tasks: '1': give a whole number of at least 2"),
    ("fidelity_memory_tasks.py", ["--methods", "m_etff"],
     f"--methods 'm_etff': unknown method(s) m_etff; choose from {METHODS}"),
    ("fidelity_time.py", ["--copies_in_flight", "0.5"],
     "argument --copies_in_flight: '0.5': give a number >= 1 or 'unlimited'"),
    ("fidelity_memory_resim.py", ["/tmp", "--graphs", "rnn"], "--graphs: no saved rnn in /tmp"),
    ("emulation_grid.py", ["/tmp", "--windows", "0,-2"],
     "argument --windows: '0,-2': give numbers of at least 0, separated by commas, such as 0,2,4"),
    ("emulation_grid.py", ["/tmp", "--jitters", "wide"],
     "argument --jitters: 'wide': give numbers of at least 0, separated by commas, such as 0.6,1.0"),
    ("emulation_grid.py", ["/tmp"], "/tmp: no <graph>.json here; write one with bench/fidelity_memory.py --save DIR"),
    ("fidelity_resim.py", ["/tmp", "--copies_in_flight", "many"],
     "argument --copies_in_flight: 'many': give a number >= 1 or 'unlimited'"),
])
def test_a_bad_value_is_one_line_and_exit_2(script, args, message):
    done = bench(script, *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.splitlines()[-1] == f"{script}: error: {message}", done.stderr
    assert "Traceback" not in done.stderr and done.stdout == "", (done.stdout, done.stderr)


def test_placement_speed_prints_the_targets_table():
    # --quick at a hundredth of the sizes: some 3 s. 'met' says '-' at sizes not the targets'.
    done = bench("placement_speed.py", "--quick", "--scale", "0.01", "--repeats", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| measure "))
    rows = [line.split("|")[1:-1] for line in lines[head + 2:] if line.startswith("|")]
    assert len(rows) == 11, done.stdout
    assert [r[1].strip() for r in rows][:2] == ["at least 20x faster", "at most 0.1 s"], done.stdout
    assert re.fullmatch(r"[\d.]+ m?s \(whole pipeline [\d.]+ m?s\)", rows[1][2].strip()), done.stdout
    assert rows[1][3].strip() == "-", done.stdout
    assert all(r[2].strip() == "skipped (--quick)" for r in rows[-4:]), done.stdout
