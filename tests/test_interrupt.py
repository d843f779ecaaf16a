"""Ctrl-C during placement leaves no partial output file and exits 130 with one line."""

import json
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def test_ctrl_c_during_place_json_writes_nothing(tmp_path):
    from baechi_tf.cluster import Cluster
    from baechi_tf.json_io import graph_to_json
    from layered import layered_graph

    src = tmp_path / "g.json"
    src.write_text(json.dumps(graph_to_json(layered_graph(5000, seed=1), Cluster.homogeneous(4, 16 << 30))))
    out = tmp_path / "p.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "baechi_tf", "-v", "place-json", str(src), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        # A shell running us in the background may have set SIGINT to "ignore", which children
        # inherit; a user's terminal would deliver Ctrl-C, so restore the default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # Wait for the first progress line of the placement, then interrupt it.
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "auto:" in line:
            break
    assert any("auto:" in x for x in lines), "".join(lines)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "baechi place-json: interrupted; nothing was written"
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]
