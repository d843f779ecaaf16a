"""auto's candidates placed side by side in worker processes (`placement_jobs`, `workers`)."""

import dataclasses
import logging
import math
import os
import re
import sys
import types

import numpy as np
import ctrl_c
import pytest

from baechi_tf.cluster import Cluster, Device, GiB
from baechi_tf.errors import ConfigError
from baechi_tf.placer.auto import RUN_FIRST, auto_candidates, judge_candidate
from baechi_tf.placer.auto.candidates import in_worker
from baechi_tf.placer.auto.workers import CandidateWorkers
from baechi_tf.placer.grouping import make_groups
from baechi_tf.placer.methods import register_method
from baechi_tf.placer.pipeline import PlacementOptions, place
from baechi_tf.rewriter.graph_pass import place_with_host

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from quality_graphs import fork_join, rnn, transformer  # noqa: E402

FOUR = Cluster.homogeneous(4, 16 * GiB)


def _worker_lines(caplog) -> dict[str, int]:
    """Candidate name -> pid of the worker that placed it, from the log."""
    found = {}
    for record in caplog.records:
        m = re.fullmatch(r"auto: (\S+) placed by worker (\d+) in [\d.]+ s", record.getMessage())
        if m:
            found[m.group(1)] = int(m.group(2))
    return found


def _same(a, b) -> None:
    assert a.placement.method == b.placement.method
    np.testing.assert_array_equal(a.placement.device_of, b.placement.device_of)
    assert a.makespan_us == b.makespan_us
    assert a.refine_stats == dataclasses.replace(b.refine_stats, seconds=a.refine_stats.seconds)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, placer_type",
    [("rnn", "default"), ("fork-join", "default"), ("transformer", "fusion")],
)
def test_side_by_side_the_placement_is_the_one_placed_in_this_process(caplog, case, placer_type):
    graph = {"rnn": rnn, "fork-join": fork_join, "transformer": transformer}[case]()
    options = PlacementOptions(refine_seconds=0.3, placer_type=placer_type)
    here = place(graph, FOUR, dataclasses.replace(options, placement_jobs=1))
    assert not _worker_lines(caplog)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="baechi_tf"):
        apart = place(graph, FOUR, dataclasses.replace(options, placement_jobs=2))
    _same(apart, here)
    # Every candidate but those that run first was placed by one of two other processes.
    by = _worker_lines(caplog)
    expected = {name for name in here.candidates if name not in RUN_FIRST}
    assert set(by) == expected and len(expected) >= 5
    assert len(set(by.values())) == 2 and os.getpid() not in by.values()
    # What the candidates logged in the workers is logged here too (layers names its layout).
    if case == "rnn":
        assert any(r.name == "baechi_tf.placer.layers" for r in caplog.records)


@pytest.mark.slow
def test_side_by_side_with_a_host_outside_the_cluster(caplog):
    graph = rnn()
    sources = [op for op in range(graph.num_ops) if not graph.predecessors[op]]
    host = Device("/device:CPU:0", 64 * GiB, type="CPU")
    pinned = tuple(host.name if op in sources else d for op, d in enumerate(graph.pinned_device))
    graph = dataclasses.replace(graph, pinned_device=pinned)
    options = PlacementOptions(refine_seconds=0.3)
    here = place_with_host(graph, FOUR, host, dataclasses.replace(options, placement_jobs=1))
    with caplog.at_level(logging.INFO, logger="baechi_tf"):
        apart = place_with_host(graph, FOUR, host, dataclasses.replace(options, placement_jobs=2))
    _same(apart, here)
    assert "packed+host" not in _worker_lines(caplog)  # it runs first, here
    assert "m_etf" in _worker_lines(caplog)
    assert apart.placement.device_of[sources].tolist() == [4] * len(sources)  # the host is last


def test_a_worker_that_dies_leaves_its_candidates_to_this_process(caplog):
    graph = rnn()
    groups = make_groups(graph, "tf")
    options = PlacementOptions(placement_jobs=2)
    thunks = dict(auto_candidates(graph, FOUR, groups, options))
    names = ["m_topo", "m_etf", "heft", "layers"]
    ended = []
    with caplog.at_level(logging.INFO, logger="baechi_tf"), CandidateWorkers(2, in_worker) as workers:
        workers.start((graph, FOUR, groups, options, None, None))
        victim = workers._workers[0].process
        victim.kill()
        victim.wait()
        outcomes = workers.run(
            list(enumerate(names)), math.inf,
            lambda i: judge_candidate(graph, FOUR, thunks[names[i]], math.inf), ended.append,
        )
    assert sorted(ended) == [0, 1, 2, 3]
    for i, name in enumerate(names):
        alone = judge_candidate(graph, FOUR, thunks[name], math.inf)
        np.testing.assert_array_equal(outcomes[i].placement.device_of, alone.placement.device_of)
        assert outcomes[i].makespan_us == alone.makespan_us
    assert f"auto: worker {victim.pid} ended (exit status -9)" in caplog.text
    assert set(_worker_lines(caplog)) == set(names)  # the other worker placed them all
    assert victim.pid not in _worker_lines(caplog).values()


def test_candidates_of_workers_that_die_at_work_are_placed_here(caplog):
    graph = rnn()
    groups = make_groups(graph, "tf")
    options = PlacementOptions(placement_jobs=2)
    thunks = dict(auto_candidates(graph, FOUR, groups, options))
    # The second worker takes m-SCT, whose LP keeps it at work when the first one's m-TOPO is in
    # (m-ETF, on the compiled engine, could come in with it).
    names = ["m_topo", "m_sct", "heft", "layers", "m_etf"]
    here = []

    def local(i):
        here.append(names[i])
        return judge_candidate(graph, FOUR, thunks[names[i]], math.inf)

    with caplog.at_level(logging.INFO, logger="baechi_tf"), CandidateWorkers(2, in_worker) as workers:
        workers.start((graph, FOUR, groups, options, None, None))
        processes = [w.process for w in workers._workers]

        def ended(i):  # once the first outcome is in, both workers die (one of them at work)
            for p in processes:
                if p.poll() is None:
                    p.kill()

        outcomes = workers.run(list(enumerate(names)), math.inf, local, ended)
    assert len(_worker_lines(caplog)) == 1
    assert sorted(here + list(_worker_lines(caplog))) == sorted(names)
    assert re.search(r"auto: worker \d+ failed on \S+, which is placed here instead", caplog.text)
    for i, name in enumerate(names):
        alone = judge_candidate(graph, FOUR, thunks[name], math.inf)
        np.testing.assert_array_equal(outcomes[i].placement.device_of, alone.placement.device_of)
    assert all(p.poll() is not None for p in processes)


def test_arguments_that_do_not_pickle_are_placed_in_this_process(caplog):
    graph = transformer()
    layout = types.MappingProxyType({graph.names[0]: "/device:GPU:1"})  # a read-only mapping
    options = PlacementOptions(refine_seconds=0.2, expert=layout)
    here = place(graph, FOUR, dataclasses.replace(options, placement_jobs=1))
    with caplog.at_level(logging.INFO, logger="baechi_tf"):
        apart = place(graph, FOUR, dataclasses.replace(options, placement_jobs=2))
    _same(apart, here)
    assert "candidates placed in this process: its arguments do not pickle" in caplog.text
    assert not _worker_lines(caplog)


@pytest.mark.slow
def test_a_method_registered_here_runs_here(caplog, methods):
    from baechi_tf.placer.heft import place_heft

    calls = []

    def my_heft(graph, cluster, groups, options):
        calls.append(os.getpid())
        return place_heft(graph, cluster, groups)

    register_method("heft", my_heft)
    with caplog.at_level(logging.INFO, logger="baechi_tf"):
        place(fork_join(), FOUR, PlacementOptions(refine_seconds=0.2, placement_jobs=2))
    by = _worker_lines(caplog)
    assert calls == [os.getpid()] * 2  # heft and heft+coplace, in this process
    assert "heft" not in by and "heft+coplace" not in by and "m_etf" in by


@pytest.mark.parametrize("jobs", [-1, 1.5, True, "2"])
def test_placement_jobs_must_be_a_whole_number(jobs):
    with pytest.raises(ConfigError, match=r"placement_jobs .* must be a whole number >= 0"):
        PlacementOptions(placement_jobs=jobs).validate()


@pytest.mark.slow
def test_ctrl_c_while_candidates_are_placed_side_by_side_stops_the_workers(tmp_path):
    from baechi_tf.json_io import graph_to_json
    from layered import layered_graph

    import json

    src = tmp_path / "g.json"
    src.write_text(json.dumps(graph_to_json(layered_graph(5000, seed=1), FOUR)))
    out = tmp_path / "p.json"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    command = [sys.executable, "-m", "baechi_tf", "-v", "place-json", str(src), "--out", str(out), "--placement_jobs", "2"]
    made = []  # the workers' files when Ctrl-C is pressed

    def ready(text):
        if "side by side" not in text:
            return False
        made.extend(os.listdir(scratch))
        return True

    status, seen, err = ctrl_c.after_output(
        command, ready, watch="stderr", cwd=ROOT,
        env=dict(os.environ, TMPDIR=str(scratch), BAECHI_TF_PROGRESS="0"),
    )
    pids = [int(p) for p in re.search(r"worker processes \(pid ([\d, ]+)\)", seen).group(1).split(", ")]
    assert len(pids) == 2
    assert status == 130, err
    assert err.strip().splitlines()[-1] == "baechi place-json: interrupted; nothing was written"
    assert not out.exists()
    for pid in pids:  # killed and waited for: gone, not left running nor a zombie
        assert not os.path.exists(f"/proc/{pid}"), pid
    assert made and os.listdir(scratch) == []
