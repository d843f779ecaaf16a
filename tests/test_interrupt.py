"""Ctrl-C during placement leaves no partial output file and exits 130 with one line."""

import json
import os
import signal
import sys

import pytest

import ctrl_c

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))


@pytest.fixture(autouse=True)
def python_handles_sigint():
    """Some tests press Ctrl-C in this process: they need Python's own SIGINT handler, which a
    shell that starts the suite in the background (`make test &`) replaces with "ignore"."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
def test_ctrl_c_during_place_json_writes_nothing(tmp_path):
    from baechi_tf.cluster import Cluster
    from baechi_tf.json_io import graph_to_json
    from layered import layered_graph

    src = tmp_path / "g.json"
    src.write_text(json.dumps(graph_to_json(layered_graph(5000, seed=1), Cluster.homogeneous(4, 16 << 30))))
    out = tmp_path / "p.json"
    # Interrupted at the first progress line of the placement.
    status, seen, err = ctrl_c.after_output(
        [sys.executable, "-m", "baechi_tf", "-v", "place-json", str(src), "--out", str(out)],
        lambda text: "auto:" in text, watch="stderr", cwd=ROOT,
    )
    assert status == 130, err
    assert err.strip().splitlines()[-1] == "baechi place-json: interrupted; nothing was written"
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]


@pytest.mark.slow
def test_ctrl_c_while_the_reports_are_made_says_what_was_written(tmp_path):
    # The message said "nothing was written" with --out written and some reports in the folder.
    out, reports = tmp_path / "p.json", tmp_path / "reports"
    # A Ctrl-C when matplotlib is first imported: while the reports are made, after --out is written.
    done = ctrl_c.at_import("matplotlib", "-m baechi_tf", "place-json", os.path.join(ROOT, "examples", "fork_join.json"),
                            "--out", str(out), "--report_dir", str(reports), cwd=ROOT)
    assert done.returncode == 130, done.stderr
    assert done.stderr == f"baechi place-json: interrupted after writing {out}\n"
    assert json.loads(out.read_text())["placement"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]  # no reports, no temporary folder


def _press_ctrl_c_inside_a_bare_except() -> None:
    """What TF's Session.run does when Ctrl-C lands while it parses a feed name."""
    try:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            signal.sigtimedwait([], 0)  # give the handler its turn; it runs between bytecodes
            raise AssertionError("SIGINT did not raise")
        except:  # noqa: E722  (the point: a library's bare except)
            raise ValueError("The name 'inputs/src:0' looks a like a Tensor name") from None
    except ValueError:
        raise TypeError("Cannot interpret feed_dict key as Tensor") from None


def test_ctrl_c_is_still_recognised_after_a_library_converts_it():
    from baechi_tf import interrupts

    with interrupts.recording():
        try:
            _press_ctrl_c_inside_a_bare_except()
        except TypeError as e:
            converted = e
    assert interrupts.was_interrupted(converted)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with interrupts.recording():  # the next run starts with no Ctrl-C on record
        assert not interrupts.was_interrupted(TypeError("a real bug"))
        assert interrupts.was_interrupted(KeyboardInterrupt())


def test_an_ignored_sigint_stays_ignored():
    from baechi_tf import interrupts

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts.recording():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)  # nohup: nothing happens
        assert not interrupts.was_interrupted(TypeError("a real bug"))
    finally:
        signal.signal(signal.SIGINT, previous)


def test_cli_exits_130_when_ctrl_c_comes_out_as_another_exception(monkeypatch, capsys, tmp_path):
    from baechi_tf import cli

    def run(args):
        _press_ctrl_c_inside_a_bare_except()

    monkeypatch.setattr(cli, "run", run)
    assert cli.main(["place-json", str(tmp_path / "g.json")]) == 130
    assert capsys.readouterr().err == "baechi place-json: interrupted; nothing was written\n"

    def bug(args):
        raise TypeError("a real bug")

    monkeypatch.setattr(cli, "run", bug)
    with pytest.raises(TypeError, match="a real bug"):  # a bug is not reported as Ctrl-C
        cli.main(["place-json", str(tmp_path / "g.json")])


def test_a_swallowed_ctrl_c_stops_the_loop_at_the_next_check():
    from baechi_tf import interrupts

    steps = 0
    with interrupts.recording():
        interrupts.check()  # nothing pressed: no effect
        with pytest.raises(KeyboardInterrupt):
            for steps in range(1, 10):
                try:  # what TF's C++ code does to a Ctrl-C: print it as a SystemError, go on
                    os.kill(os.getpid(), signal.SIGINT)
                    signal.sigtimedwait([], 0)
                except KeyboardInterrupt:
                    pass
                interrupts.check()
    assert steps == 1
    with interrupts.recording():
        interrupts.check()  # a new run starts clean


def test_exit_status_gives_one_line_per_outcome_and_raises_a_bug(capsys):
    from baechi_tf import interrupts
    from baechi_tf.errors import ConfigError

    lines = dict(interrupted="prog: interrupted", failed="prog: error: ")
    with interrupts.recording():  # starts clean: no Ctrl-C of an earlier test is remembered
        assert interrupts.exit_status(ConfigError("--steps must be positive"), **lines) == 2
        assert capsys.readouterr().err == "prog: error: --steps must be positive\n"
        with pytest.raises(ValueError, match="a bug"):
            interrupts.exit_status(ValueError("a bug"), **lines)
        assert capsys.readouterr().err == ""
        assert interrupts.exit_status(KeyboardInterrupt(), **lines) == 130
        assert capsys.readouterr().err == "prog: interrupted\n"
