"""Progress bars: what they draw, when, nesting, and the long work that shows them."""

import io
import logging
import os
import pty
import subprocess
import sys
import threading

import numpy as np
import pytest

from baechi_tf import progress
from baechi_tf.cluster import Cluster
from baechi_tf.progress import Progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Terminal(io.StringIO):
    """A stream that says it is a terminal, and signals each write."""

    def __init__(self):
        super().__init__()
        self.wrote = threading.Event()

    def isatty(self):
        return True

    def write(self, text):
        n = super().write(text)
        self.wrote.set()
        return n


@pytest.fixture
def no_delay(monkeypatch):
    monkeypatch.delenv("BAECHI_TF_PROGRESS", raising=False)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "_MIN_REDRAW_S", 0.0)


def drawn(stream):
    """The lines drawn on `stream`, in order (each redraw starts with a carriage return)."""
    return [part.replace("\x1b[K", "") for part in stream.getvalue().split("\r")]


def test_a_bar_draws_share_counts_and_note_and_clears_its_line(no_delay):
    term = Terminal()
    with Progress("profiling", 8, unit="steps", stream=term) as bar:
        bar.update(advance=2, note="warm-up")
        bar.update(6, note="traced")
    lines = drawn(term)
    assert lines[1].startswith("profiling  [######------------------]   25%  2/8 steps  ")
    assert lines[1].endswith(" s  warm-up")
    assert lines[2].startswith("profiling  [##################------]   75%  6/8 steps  ")
    assert lines[-1] == ""  # the line is cleared at the end: nothing is left behind
    assert term.getvalue().endswith("\r\x1b[K")


def test_without_a_total_it_draws_the_time_and_without_counts_the_share(no_delay):
    term = Terminal()
    with Progress("LP", stream=term) as bar:
        bar.update(note="4,000 arcs")
    assert drawn(term)[1].startswith("LP  ") and drawn(term)[1].endswith(" s  4,000 arcs")
    term = Terminal()
    with Progress("refine", 400, counts=False, stream=term) as bar:
        bar.update(100)
    assert drawn(term)[1].startswith("refine  [######------------------]   25%  ")
    assert "100/400" not in term.getvalue()


def test_nested_bars_draw_the_innermost_and_the_outer_comes_back(no_delay):
    term = Terminal()
    with Progress("auto", 3, stream=term) as outer:
        outer.update(advance=1, note="m_sct")
        with Progress("LP", 2, stream=term) as inner:
            outer.update(note="not drawn while LP is")
            inner.update(advance=1)
        after = len(term.getvalue())
    lines = drawn(term)
    assert [line.split("  ")[0] for line in lines if line] == ["auto", "LP", "auto"]
    assert not any("not drawn" in line for line in lines[:3])
    assert "not drawn while LP is" in term.getvalue()[:after]  # outer redrew itself at once


def test_shown_on_terminals_only_unless_the_environment_says(no_delay, monkeypatch):
    plain = io.StringIO()
    with Progress("x", 2, stream=plain) as bar:
        bar.update(1)
    assert plain.getvalue() == ""
    monkeypatch.setenv("BAECHI_TF_PROGRESS", "1")
    with Progress("x", 2, stream=plain) as bar:
        bar.update(1)
    assert "x  [" in plain.getvalue()
    monkeypatch.setenv("BAECHI_TF_PROGRESS", "0")
    term = Terminal()
    with Progress("x", 2, stream=term) as bar:
        bar.update(1)
    assert term.getvalue() == ""


def test_short_work_draws_nothing(monkeypatch):
    monkeypatch.delenv("BAECHI_TF_PROGRESS", raising=False)
    monkeypatch.setattr(progress, "DELAY_S", 3600.0)
    term = Terminal()
    with Progress("x", 2, stream=term) as bar:
        bar.update(1)
    assert term.getvalue() == ""


def test_a_ticking_bar_redraws_while_the_caller_blocks(no_delay):
    term = Terminal()
    with Progress("LP", tick=True, stream=term):
        # No update: only the ticker thread can draw.
        assert term.wrote.wait(30)
    assert drawn(term)[1].startswith("LP  ")


def test_a_broken_stream_does_not_fail_the_work(no_delay):
    term = Terminal()
    term.close()
    with Progress("x", 2, stream=term) as bar:
        bar.update(1)


def test_long_work_shows_its_bars(no_delay, monkeypatch, capsys):
    # Refinement, auto's placers and m-SCT's LP, drawn on stderr.
    monkeypatch.setenv("BAECHI_TF_PROGRESS", "1")
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from quality_graphs import fork_join

    from baechi_tf.placer.pipeline import PlacementOptions, place

    graph = fork_join()
    place(graph, Cluster.homogeneous(4, 1 << 34), PlacementOptions(refine_seconds=0.2))
    err = capsys.readouterr().err
    assert "\rauto: placers  [" in err and "m_etf" in err
    assert "\rrefine  [" in err and "  best " in err and " us (" in err
    assert "\rm-SCT LP (" in err and " arcs" in err


def test_a_placer_and_the_simulator_show_the_ops_scheduled(no_delay, monkeypatch, capsys):
    # m-ETF alone on a large graph ran for seconds with nothing on the screen.
    monkeypatch.setenv("BAECHI_TF_PROGRESS", "1")
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from layered import layered_graph

    from baechi_tf.placer.pipeline import PlacementOptions, place

    place(layered_graph(3000, seed=1), Cluster.homogeneous(4, 1 << 34), PlacementOptions(placement_method="m_etf"))
    err = capsys.readouterr().err
    # m-ETF's own schedule is checked; the simulator runs for the one-device baseline.
    assert "\rm_etf: scheduling  [" in err and "/3,000 ops" in err and "\rsimulating single  [" in err
    assert err.endswith("\r\x1b[K")  # cleared at the end


@pytest.mark.tf
def test_profiling_shows_its_steps(no_delay, monkeypatch, capsys):
    import tensorflow as tf

    from baechi_tf.cost_model.profiler import profile_fetch

    monkeypatch.setenv("BAECHI_TF_PROGRESS", "1")
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4])
        y = tf.reduce_sum(x * 2.0)
    with tf.compat.v1.Session(graph=g) as sess:
        profile_fetch(sess, y, {x: np.ones(4, np.float32)}, warmup_steps=1, traced_steps=2)
    err = capsys.readouterr().err
    assert "\rprofiling  [" in err and "/3 steps" in err and "traced" in err


@pytest.mark.slow
def test_the_cli_draws_bars_on_a_terminal_and_none_in_a_pipe(tmp_path):
    # A real terminal (a pty) on stderr, the default delay: placing 1,000 ops shows the bars.
    import json

    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from layered import layered_graph

    from baechi_tf.json_io import graph_to_json

    src = str(tmp_path / "layered.json")
    with open(src, "w") as f:
        json.dump(graph_to_json(layered_graph(1000, seed=0), Cluster.homogeneous(4, 1 << 34)), f)
    env = {k: v for k, v in os.environ.items() if k != "BAECHI_TF_PROGRESS"}
    # The bars show after a 0.5 s delay. A 1 s budget took 0.54 s on a fast day: the refine bar
    # came and went unseen; 3 s of budget lasts past it. The compiled engine refines these 1,000
    # ops in 0.3 s and places them in less than the delay: the reference engine keeps both
    # phases on screen past it.
    cmd = [sys.executable, "-m", "baechi_tf", "place-json", src, "--refine_seconds", "3",
           "--engine", "python", "--out", str(tmp_path / "p.json")]
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=follower, timeout=600)
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # the terminal's other end is closed: all is read
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert done.returncode == 0
    shown = b"".join(chunks)
    assert b"\rauto: placers  [" in shown and b"\rrefine  [" in shown
    piped = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=600)
    assert piped.returncode == 0
    assert b"\r" not in piped.stderr


def test_a_log_record_clears_the_bar_first(no_delay, monkeypatch):
    term = Terminal()
    handler = logging.StreamHandler(term)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with Progress("x", 2, stream=term) as bar:
            bar.update(1)
            logging.getLogger("baechi_tf.test").warning("a warning")
            bar.update(2)
    finally:
        root.removeHandler(handler)
    text = term.getvalue()
    # The bar, its line cleared, the record on a line of its own, the bar again, cleared.
    assert "]   50%  1/2  " in text
    assert "\x1b[K\r\x1b[Ka warning\n\rx  [" in text
    assert text.endswith("\r\x1b[K")
