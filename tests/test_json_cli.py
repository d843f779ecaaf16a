"""`baechi place-json`: the JSON schema, the summary, and every bad input ending in exit 2."""

import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

from baechi_tf.cli import main
from baechi_tf.errors import BaechiError
from baechi_tf.json_io import parse_graph_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "fork_join.json")


def small_doc():
    return {
        "devices": [
            {"name": "/device:GPU:0", "memory_bytes": 1 << 30},
            {"name": "/device:GPU:1", "memory_bytes": 1 << 30},
        ],
        "comm": {"slope_us_per_byte": 0.0001754, "intercept_us": 134},
        "ops": [
            {"name": "a", "compute_us": 12.5, "output_bytes": [4096]},
            {"name": "b", "compute_us": 500, "output_bytes": [4096], "temp_bytes": 10,
             "colocation_group": "g1"},
            {"name": "c", "compute_us": 500, "output_bytes": [4], "persistent_bytes": 64,
             "device": "/device:GPU:1"},
        ],
        "edges": [{"src": "a", "dst": "b", "src_output": 0}, {"src": "a", "dst": "c", "control": True}],
    }


def test_parse_schema():
    graph, cluster = parse_graph_json(small_doc())
    assert graph.names == ("a", "b", "c")
    assert graph.colocation[1] == ("g1",)
    assert graph.pinned_device[2] == "/device:GPU:1"
    assert graph.is_control.tolist() == [False, True]
    assert cluster.names == ("/device:GPU:0", "/device:GPU:1")
    assert cluster.devices[0].type == "GPU"


def test_graph_to_json_round_trip():
    from baechi_tf.json_io import graph_to_json

    graph, cluster = parse_graph_json(small_doc())
    again, cluster2 = parse_graph_json(json.loads(json.dumps(graph_to_json(graph, cluster))))
    assert again.names == graph.names and cluster2 == cluster
    assert again.edge_src.tolist() == graph.edge_src.tolist()
    assert again.edge_src_output.tolist() == graph.edge_src_output.tolist()
    assert again.compute_us.tolist() == graph.compute_us.tolist()
    assert again.output_bytes == graph.output_bytes
    assert again.colocation == graph.colocation and again.pinned_device == graph.pinned_device


def test_place_json_writes_output(tmp_path, capsys):
    src = tmp_path / "g.json"
    src.write_text(json.dumps(small_doc()))
    out = tmp_path / "p.json"
    assert main(["place-json", str(src), "--placement_method", "m_etf", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "makespan (simulated)" in printed and "lower bound" in printed
    doc = json.loads(out.read_text())
    assert set(doc) >= {
        "placement", "makespan_us", "single_device_makespan_us", "lower_bound_us",
        "peak_memory_bytes", "placement_seconds",
    }
    assert set(doc["placement"]) == {"a", "b", "c"}
    assert doc["placement"]["c"] == "/device:GPU:1"
    assert doc["makespan_us"] >= doc["lower_bound_us"]
    assert set(doc["peak_memory_bytes"]) == {"/device:GPU:0", "/device:GPU:1"}
    assert set(doc["reordered_peak_bytes"]) == {"/device:GPU:0", "/device:GPU:1"}
    assert all(doc["reordered_peak_bytes"][d] >= p for d, p in doc["peak_memory_bytes"].items())



def test_the_one_device_figure_says_when_pins_keep_it_on_several(tmp_path, capsys):
    # Two 10 us ops pinned to two devices: "one device 0.010 ms", which one device cannot do.
    doc = {
        "devices": [{"name": f"/device:GPU:{i}", "memory_bytes": 1 << 20} for i in range(2)],
        "ops": [{"name": "a", "compute_us": 10, "output_bytes": [4], "device": "/device:GPU:1"},
                {"name": "b", "compute_us": 10, "device": "/device:GPU:0"}],
    }
    src = tmp_path / "pins.json"
    src.write_text(json.dumps(doc))
    assert main(["place-json", str(src), "--placement_method", "m_etf"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [x for x in lines if x.startswith("one device")] == [
        "one device + pins (2 devices) 0.010 ms  (speed-up 1.00x)"
    ]
    # The other figures line up with it (they stood a column to the left of it).
    assert "method                        m_etf" in lines
    assert "transfers                     0" in lines
    doc["ops"][0].pop("device")
    src.write_text(json.dumps(doc))
    assert main(["place-json", str(src)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [x for x in lines if x.startswith("one device")] == ["one device             0.020 ms  (speed-up 2.00x)"]

def test_the_one_device_figure_runs_on_the_device_the_pins_share(tmp_path, capsys):
    # The JSON format page's example (docs/json.md, once the README's): 'a' pinned to GPU:1. The baseline put 'b' and 'c' on GPU:0 (the first
    # of the largest devices), so "one device" paid a copy: 746.5 us where GPU:1 alone takes 612.5.
    with open(os.path.join(ROOT, "docs", "json.md"), encoding="utf-8") as f:
        readme = f.read()
    start = readme.index("```json", readme.index("\nInput (")) + len("```json")
    src = tmp_path / "readme.json"
    src.write_text(readme[start:readme.index("```", start)])
    out = tmp_path / "out.json"
    assert main(["place-json", str(src), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["single_device_makespan_us"] == pytest.approx(612.5)
    assert any(x.startswith("one device             0.613 ms") for x in capsys.readouterr().out.splitlines())


def test_example_runs_as_module():
    proc = subprocess.run(
        [sys.executable, "-m", "baechi_tf", "place-json", EXAMPLE, "--placement_method", "m_topo"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "/device:GPU:3" in proc.stdout


def mutate(fn):
    doc = small_doc()
    fn(doc)
    return json.dumps(doc)


BAD = {
    "syntax": ("{ not json", "not valid JSON: .* line 1"),
    "truncated": (json.dumps(small_doc())[:-40], "not valid JSON"),
    "empty": ("", "not valid JSON"),
    "not utf-8": (b"\xff\xfe\x00garbage", "not UTF-8"),
    "top not object": ("[1, 2]", "top level must be an object"),
    "no devices": (mutate(lambda d: d.pop("devices")), "has no 'devices'"),
    "zero devices": (mutate(lambda d: d.update(devices=[])), "'devices' is empty"),
    "no ops": (mutate(lambda d: d.pop("ops")), "has no 'ops'"),
    "op without name": (mutate(lambda d: d["ops"][0].pop("name")), r"ops\[0\] has no 'name'"),
    "op without compute": (mutate(lambda d: d["ops"][1].pop("compute_us")), "op 'b' has no 'compute_us'"),
    "negative cost": (mutate(lambda d: d["ops"][1].update(compute_us=-5)), "compute_us=-5"),
    "NaN cost": (mutate(lambda d: d["ops"][1].update(compute_us=float("nan"))), "NaN is not a number"),
    "string cost": (mutate(lambda d: d["ops"][1].update(compute_us="5")), "expected an integer or a number"),
    "negative memory": (mutate(lambda d: d["ops"][1].update(temp_bytes=-1)), "temp_bytes=-1"),
    "fractional bytes": (mutate(lambda d: d["ops"][1].update(output_bytes=[1.5])), "whole number of bytes"),
    "unknown op field": (mutate(lambda d: d["ops"][1].update(compute=5)), "unknown field.*'compute'"),
    "duplicate op": (mutate(lambda d: d["ops"].append(dict(d["ops"][0]))), "'a' is used by two ops"),
    "unknown edge op": (mutate(lambda d: d["edges"].append({"src": "a", "dst": "zz"})), "names op 'zz'"),
    "bad output slot": (mutate(lambda d: d["edges"].append({"src": "a", "dst": "c", "src_output": 3})), "reads output 3"),
    "cycle": (mutate(lambda d: d["edges"].append({"src": "b", "dst": "a"})), "cycle: 'a' -> 'b' -> 'a'"),
    "missing pinned device": (mutate(lambda d: d["ops"][0].update(device="/device:GPU:7")), "pinned to '/device:GPU:7'"),
    "malformed device name": (mutate(lambda d: d["devices"][0].update(name="gpu zero")), "malformed"),
    "duplicate device": (mutate(lambda d: d["devices"].append(dict(d["devices"][0]))), "same device"),
    "zero memory device": (mutate(lambda d: d["devices"][0].update(memory_bytes=0)), "positive capacity"),
    "bad comm": (mutate(lambda d: d["comm"].update(intercept_us=-1)), "intercept_us=-1"),
    # auto failed with a TypeError in HEFT (copies of inf us); m-ETF printed 'inf ms'
    "endless copies": (mutate(lambda d: d["comm"].update(intercept_us=1e308)), "intercept_us=1e\\+308: every copy"),
    # a 300-digit step time
    "endless bytes": (mutate(lambda d: d["comm"].update(slope_us_per_byte=1e300)), "a copy of a GiB would take"),
    # JSON integers have no limit: a 401-digit one was an OverflowError traceback (math.isfinite)
    "integer too long for a float": (
        mutate(lambda d: d["ops"][1].update(compute_us=10**400)),
        "op 'b' has compute_us=<an integer of 401 digits>, larger than any time or size can be",
    ),
    "memory too long for a float": (
        mutate(lambda d: d["devices"][0].update(memory_bytes=10**400)),
        r"devices\[0\] has memory_bytes=<an integer of 401 digits>",
    ),
    "comm too long for a float": (
        mutate(lambda d: d["comm"].update(intercept_us=10**309)), "intercept_us=<an integer of 310 digits>"
    ),
    # the message printed int(1e300), 301 digits
    "memory as a float too large": (
        mutate(lambda d: d["devices"][0].update(memory_bytes=1e300)),
        r"devices\[0\] has memory_bytes=1e\+300, more bytes than any device can hold "
        r"\(2\*\*63 - 1 at most\); give a size in bytes$",
    ),
    "output as a float too large": (
        mutate(lambda d: d["ops"][0].update(output_bytes=[4e19])),
        r"op 'a' has output_bytes=4e\+19, more bytes",
    ),
    # more digits than Python's int() converts: 'use sys.set_int_max_str_digits() to increase
    # the limit', no field named
    "integer too long to convert": (
        mutate(lambda d: d["ops"][1].update(compute_us="LONG")).replace('"LONG"', "1" + "0" * 5000),
        "op 'b' has compute_us=<an integer of 5001 digits>, larger than any time or size can be",
    ),
    "slot too long to convert": (
        mutate(lambda d: d["edges"][0].update(src_output="LONG")).replace('"LONG"', "1" + "0" * 5000),
        r"edges\[0\] has src_output=<an integer of 5001 digits>, larger than",
    ),
    # json.loads keeps the last of a repeated key: a second 'edges' dropped the first one's edges
    "repeated key": (
        json.dumps(small_doc())[:-1] + ', "edges": []}',
        "the graph has 'edges' more than once .*; keep one",
    ),
    "repeated key in an op": (
        json.dumps(small_doc()).replace('"compute_us": 12.5', '"compute_us": 12.5, "compute_us": 1', 1),
        r"ops\[0\] has 'compute_us' more than once",
    ),
    # JSON's \ud800 is half of a UTF-16 pair, no character: the reports' text failed with a
    # traceback (exit 1) after --out was written
    "lone surrogate in a name": (
        mutate(lambda d: d["ops"][1].update(name="b\ud800")),
        r"ops\[1\] has name='b\\ud800', which holds a lone UTF-16 surrogate .*; fix the text",
    ),
    "lone surrogate in a type": (
        mutate(lambda d: d["ops"][1].update(type="\udfffMatMul")), r"op 'b' has type='\\udfffMatMul'",
    ),
    "does not fit": (
        mutate(lambda d: d["ops"][2].update(persistent_bytes=2 << 30)),
        "op 'c' cannot run on '/device:GPU:1', where it is pinned, whatever else goes there: .* "
        "over the 1.00 GiB of that device; give it more memory, or pin the op elsewhere$",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_exits_2_with_one_line(tmp_path, case):
    content, match = BAD[case]
    src = tmp_path / "g.json"
    src.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    out = tmp_path / "p.json"
    proc = subprocess.run(
        [sys.executable, "-m", "baechi_tf", "place-json", str(src), "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("baechi place-json: error: ")
    import re

    assert re.search(match, lines[0]), lines[0]
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [src]  # no temporary file left behind either
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before


def test_missing_file(tmp_path):
    with pytest.raises(BaechiError, match="cannot read"):
        from baechi_tf.json_io import load_graph_json

        load_graph_json(str(tmp_path / "nope.json"))


def test_bad_flag_value_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["place-json", EXAMPLE, "--placement_method", "m_nope"])
    assert e.value.code == 2
    assert "invalid choice: 'm_nope'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["place-json", EXAMPLE], ["place", "--graph", "g.pb", "--cost_path", "c.pb", "--out", "o.pb"]])
def test_expert_is_not_offered_where_no_layout_can_be_given_and_says_where_it_works(capsys, command):
    # Both listed 'expert', which then failed after the input was read, with no way out.
    with pytest.raises(SystemExit) as e:
        main([command[0], "--help"])
    assert e.value.code == 0
    offered = re.search(r"--placement_method \{([^}]*)\}", capsys.readouterr().out).group(1).split(",")
    assert "expert" not in offered and {"auto", "m_etf", "single"} <= set(offered)
    with pytest.raises(SystemExit) as e:
        main([*command, "--placement_method", "expert"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"baechi {command[0]}: error: argument --placement_method: 'expert' places by a "
                          "model's own hand layout, which this command cannot be given"), err
    assert "train.py" in err and "PlacementOptions(expert=" in err and "such as auto" in err


def test_bad_memory_fraction_exits_2(capsys):
    assert main(["place-json", EXAMPLE, "--placer_memory_fraction", "1.5"]) == 2
    assert "must be in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["1.5", "0", "-0.5", "nan"])
def test_a_placer_memory_fraction_out_of_range_names_the_flag(capsys, tmp_path, value):
    # The line said 'memory fraction 1.5 must be in (0, 1]': no flag of place-json is called
    # that, and a BaechiSession's memory_fraction= is another share (train.py's --memory_fraction).
    out = tmp_path / "p.json"
    assert main(["place-json", EXAMPLE, "--placer_memory_fraction", value, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"baechi place-json: error: --placer_memory_fraction={value} must be in (0, 1]"), err
    assert "share of each device's memory the placer may fill" in err[0], err
    assert not out.exists()


def test_the_summary_shows_the_placer_s_share_of_each_device(capsys, tmp_path):
    # It showed each device's whole memory only: a peak near half of it looked like room left
    # under --placer_memory_fraction 0.5.
    path = tmp_path / "g.json"
    path.write_text(json.dumps(small_doc()))
    assert main(["place-json", str(path), "--placer_memory_fraction", "0.25"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"device +ops +compute ms +peak memory +capacity +placer's share \(25%\)", lines[0])
    for line in lines[1:3]:
        assert line.split()[-4:] == ["1.00", "GiB", "256.00", "MiB"], line
    assert main(["place-json", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"device +ops +compute ms +peak memory +capacity", lines[0])
    assert lines[1].endswith("1.00 GiB"), lines[1]


def test_help_explains():
    proc = subprocess.run(
        [sys.executable, "-m", "baechi_tf", "place-json", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0
    assert "--placement_method" in proc.stdout and "--out" in proc.stdout


def test_the_baechi_command_is_installed_and_explains():
    # The console script setup.py installs, beside the interpreter that runs the tests.
    baechi = os.path.join(os.path.dirname(sys.executable), "baechi")
    proc = subprocess.run([baechi, "--help"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "place-json" in proc.stdout and "BAECHI_TF_PROGRESS" in proc.stdout


def test_placer_flags_reach_the_placer(tmp_path, caplog):
    import logging

    # m-SCT on a fused graph with HiGHS named: what the flags ask for is what ran.
    out = tmp_path / "p.json"
    args = ["place-json", EXAMPLE, "--placement_method", "m_sct", "--placer_type", "fusion",
            "--grouper", "coplace", "--lp_solver", "highs", "--sct_threshold", "0.2", "--engine", "python",
            "--out", str(out)]
    with caplog.at_level(logging.INFO, logger="baechi_tf"):
        assert main(args) == 0
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "m-SCT LP:" in logged and " by highs," in logged, logged
    assert "fusion (auto path check): " in logged
    assert json.loads(out.read_text())["placement_method"] == "m_sct"
    with pytest.raises(SystemExit) as e:
        main(["place-json", EXAMPLE, "--lp_solver", "nope"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["place-json", EXAMPLE, "--engine", "nope"])
    assert e.value.code == 2


def test_a_report_folder_that_is_a_dangling_link_is_refused_first(tmp_path, capsys):
    # The check climbed past a link to nothing (os.path.exists is false for it); makedirs then
    # failed on it ('cannot write ...: File exists') after the placement, with --out written.
    src = tmp_path / "g.json"
    src.write_text(json.dumps(small_doc()))
    out = tmp_path / "p.json"
    (tmp_path / "reports").symlink_to(tmp_path / "gone" / "reports")
    for folder in ("reports", os.path.join("reports", "run1")):
        capsys.readouterr()
        assert main(["place-json", str(src), "--out", str(out), "--report_dir", str(tmp_path / folder)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is a link to {str(tmp_path / 'gone' / 'reports')!r}, which does not exist" in err[0], err
        assert err[0].endswith("create the folder it names, or give another folder")
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json", "reports"]


def test_outputs_that_would_lose_an_input_or_the_work_are_refused_first(tmp_path, capsys):
    # --out equal to the input overwrote it; a --report_dir that is a file ended in a traceback
    # after the placement, with --out already written.
    src = tmp_path / "g.json"
    src.write_text(json.dumps(small_doc()))
    before = src.read_bytes()
    assert main(["place-json", str(src), "--out", str(tmp_path / "." / "g.json")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"baechi place-json: error: --out {str(tmp_path / '.' / 'g.json')!r} would overwrite an input; write elsewhere"
    )
    assert src.read_bytes() == before
    a_file, out = tmp_path / "a_file", tmp_path / "p.json"
    a_file.write_text("kept")
    assert main(["place-json", str(src), "--out", str(out), "--report_dir", str(a_file)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"baechi place-json: error: --report_dir {str(a_file)!r} is a file, not a folder; "
                   "give a folder (it is created if missing)"]
    assert not out.exists() and a_file.read_text() == "kept"
    assert main(["place-json", str(src), "--report_dir", str(a_file / "under")]) == 2
    assert "is a file, so the folder cannot be created" in capsys.readouterr().err
    # Empty paths were taken and nothing written, with exit status 0.
    for flag in ("--out", "--report_dir"):
        assert main(["place-json", str(src), f"{flag}="]) == 2
        assert capsys.readouterr().err.strip() == f"baechi place-json: error: {flag} is empty; give a path, or leave the flag out"



def test_an_output_written_over_keeps_its_mode_and_a_link_stays_a_link(tmp_path, capsys):
    # A 0600 output became 0644 (and 0444 became 0644): a new file took its place. A link given as
    # --out was replaced by a plain file, and its target never written.
    old = os.umask(0o022)
    try:
        for mode in (0o600, 0o444, 0o640):
            out = tmp_path / f"p{mode:o}.json"
            out.write_text("old")
            out.chmod(mode)
            assert main(["place-json", EXAMPLE, "--out", str(out), "--refine_seconds", "0"]) == 0
            assert out.stat().st_mode & 0o7777 == mode
            assert json.loads(out.read_text())["placement"]
        (tmp_path / "kept").mkdir()
        target = tmp_path / "kept" / "target.json"
        target.write_text("old")
        links = {"link.json": "kept/target.json", "dangling.json": "kept/new.json"}  # relative links
        for name, to in links.items():
            (tmp_path / name).symlink_to(to)
            assert main(["place-json", EXAMPLE, "--out", str(tmp_path / name), "--refine_seconds", "0"]) == 0
            assert (tmp_path / name).is_symlink() and os.readlink(tmp_path / name) == to
            assert json.loads((tmp_path / to).read_text())["placement"]
        assert sorted(os.listdir(tmp_path / "kept")) == ["new.json", "target.json"]  # no temporary file
        # A link whose target's folder is missing is refused before placing, as a missing folder is.
        (tmp_path / "nowhere.json").symlink_to("missing/p.json")
        capsys.readouterr()
        assert main(["place-json", EXAMPLE, "--out", str(tmp_path / "nowhere.json")]) == 2
        assert capsys.readouterr().err.strip() == (
            f"baechi place-json: error: --out {str(tmp_path / 'nowhere.json')!r}: the folder "
            f"{str(tmp_path / 'missing')!r} does not exist; create it first")
    finally:
        os.umask(old)


def test_verbose_goes_before_or_after_the_command(capsys):
    # "baechi place-json g.json -v" was "unrecognized arguments: -v".
    import logging

    for argv in (["-v", "place-json", EXAMPLE], ["place-json", EXAMPLE, "-v"], ["place-json", EXAMPLE, "--verbose"]):
        logging.getLogger().handlers.clear()  # basicConfig sets the level only once
        assert main([*argv, "--placement_method", "m_etf"]) == 0
        assert logging.getLogger().level == logging.INFO
    logging.getLogger().handlers.clear()
    assert main(["place-json", EXAMPLE, "--placement_method", "m_etf"]) == 0
    assert logging.getLogger().level == logging.WARNING
    capsys.readouterr()

def test_a_file_with_a_byte_order_mark_is_read(tmp_path, capsys):
    # "Unexpected UTF-8 BOM (decode using utf-8-sig)": Python's advice, not ours.
    src = tmp_path / "g.json"
    src.write_bytes(b"\xef\xbb\xbf" + json.dumps(small_doc()).encode())
    assert main(["place-json", str(src), "--placement_method", "m_etf"]) == 0
    assert "makespan (simulated)" in capsys.readouterr().out


@pytest.mark.slow
def test_reports_that_would_replace_an_input_or_the_output_are_refused_first(tmp_path, capsys):
    # An input named like a report (summary.json) beside --report_dir was replaced by the report,
    # with exit status 0; so was an --out named trace.json in the report folder.
    src = tmp_path / "summary.json"
    src.write_text(json.dumps(small_doc()))
    before = src.read_bytes()
    assert main(["place-json", str(src), "--report_dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"baechi place-json: error: --report_dir {str(tmp_path)!r} would replace {str(src)!r} with a "
        "report of the same name; write the reports into another folder"
    )
    assert src.read_bytes() == before
    # A link in the report folder, under a report's name, to the input is refused too.
    other = tmp_path / "g.json"
    other.write_text(json.dumps(small_doc()))
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "trace.json").symlink_to(other)
    assert main(["place-json", str(other), "--report_dir", str(reports)]) == 2
    assert "would replace" in capsys.readouterr().err
    out = tmp_path / "out" / "trace.json"
    out.parent.mkdir()
    assert main(["place-json", str(other), "--out", str(out), "--report_dir", str(out.parent)]) == 2
    assert f"would replace {str(out)!r}" in capsys.readouterr().err
    assert not out.exists() and other.read_text() == json.dumps(small_doc())
    # Beside inputs and outputs of other names, reports are written.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    kept = fresh / "g.json"
    kept.write_text(json.dumps(small_doc()))
    assert main(["place-json", str(kept), "--out", str(fresh / "p.json"), "--report_dir", str(fresh)]) == 0
    assert (fresh / "trace.json").exists() and (fresh / "p.json").exists()
    assert kept.read_text() == json.dumps(small_doc())


def test_out_and_report_dir_on_one_path_are_refused_first(tmp_path, capsys, monkeypatch):
    # --out and --report_dir naming one new path, or the report folder inside --out, passed the
    # checks: after the placement --out was written, then the reports failed with FileExistsError.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rep").mkdir()
    os.symlink("rep/trace.json", "link.json")  # --out through a link to a report's name
    cases = [
        (["--out", "same", "--report_dir", "same"],
         "--report_dir 'same' and --out 'same' name the same path; give --report_dir a folder of its own"),
        (["--out", "o2", "--report_dir", "o2/reports"],
         "--report_dir 'o2/reports' is inside --out 'o2', which is written as a file; give --report_dir "
         "a folder elsewhere"),
        (["--out", "o3/", "--report_dir", "o3"], "--out 'o3/' names a folder, not a file; give the name of a file"),
        (["--out", "link.json", "--report_dir", "rep"],
         "--report_dir 'rep' would replace 'link.json' with a report of the same name; write the reports "
         "into another folder"),
    ]
    for flags, message in cases:
        assert main(["place-json", EXAMPLE, *flags]) == 2, flags
        captured = capsys.readouterr()
        assert captured.err == f"baechi place-json: error: {message}\n" and captured.out == ""
        assert sorted(os.listdir(tmp_path)) == ["link.json", "rep"] and os.listdir("rep") == []


def test_a_report_folder_holding_files_of_the_users_is_refused_first(tmp_path, capsys):
    # A trace.json or graph.pbtxt of the user's in --report_dir was replaced by the report's.
    src = tmp_path / "g.json"
    src.write_text(json.dumps(small_doc()))
    reports = tmp_path / "reports"
    reports.mkdir()
    mine = {"trace.json": '{"my": "trace"}', "graph.pbtxt": 'node { name: "a" op: "NoOp" }'}
    for name, text in mine.items():
        (reports / name).write_text(text)

    def refused(names):
        assert main(["place-json", str(src), "--report_dir", str(reports)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err == (
            f"baechi place-json: error: --report_dir {str(reports)!r} holds {names}, not from an "
            f"earlier report, which a report would replace; write the reports into another folder, "
            f"or remove {'them' if ',' in names else 'it'}\n")

    refused("'graph.pbtxt', 'trace.json'")
    assert {n: (reports / n).read_text() for n in os.listdir(reports)} == mine
    # Another tool's summary.json is the user's too.
    (reports / "trace.json").unlink()
    (reports / "graph.pbtxt").unlink()
    (reports / "summary.json").write_text('{"files": ["trace.json"]}')
    refused("'summary.json'")
    # An earlier report of ours is written over, as before; a file of the user's beside it is not.
    (reports / "summary.json").unlink()
    assert main(["place-json", str(src), "--report_dir", str(reports)]) == 0
    assert main(["place-json", str(src), "--report_dir", str(reports)]) == 0
    before = {n: (reports / n).read_bytes() for n in os.listdir(reports)}
    (reports / "memory_7.png").write_text("mine")
    capsys.readouterr()
    refused("'memory_7.png'")
    assert {n: (reports / n).read_bytes() for n in os.listdir(reports)} == {**before, "memory_7.png": b"mine"}


@pytest.mark.slow
def test_a_closed_stdout_still_gets_the_outputs_written(tmp_path):
    # The summary was printed before --out was written: a reader that went away (`| head`) cost
    # the output and gave a BrokenPipeError traceback.
    out, reports = tmp_path / "p.json", tmp_path / "reports"
    proc = subprocess.Popen(
        [sys.executable, "-m", "baechi_tf", "place-json", EXAMPLE, "--out", str(out), "--report_dir", str(reports)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
    )
    proc.stdout.close()  # before the command prints anything: it first imports and places
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err
    assert err == "" and json.loads(out.read_text())["placement"]
    assert (reports / "summary.json").exists()


def test_the_one_device_baseline_and_its_label_with_host_ops_and_small_devices():
    from baechi_tf.cluster import Cluster, Device
    from baechi_tf.graph_builder import OpGraphBuilder
    from baechi_tf.placer.pipeline import PlacementOptions, place
    from baechi_tf.report import one_device_label
    from baechi_tf.rewriter.graph_pass import place_with_host

    # With ops on the host, the baseline was made again on the largest device, pins and all:
    # `single` (everything on GPU:1, where 'a' is pinned) showed a 1.73x speed-up over itself.
    b = OpGraphBuilder()
    b.add_op("in", compute_us=5, output_bytes=[4_000_000], device="/device:CPU:0")
    b.add_op("a", compute_us=100, output_bytes=[4_000_000], device="/device:GPU:1")
    b.add_op("b", compute_us=100, output_bytes=[4_000_000])
    b.add_edge("in", "a")
    b.add_edge("a", "b")
    gpus = Cluster((Device("/device:GPU:0", 10**9), Device("/device:GPU:1", 10**9)))
    host = Device("/device:CPU:0", 10**10, type="CPU")
    r = place_with_host(b.build(), gpus, host, PlacementOptions(placement_method="single"))
    assert r.single_device_makespan_us == pytest.approx(r.makespan_us)
    assert one_device_label(r) == "one device"

    # The pins share GPU:1, too small for the graph: the baseline runs on GPU:0 and GPU:1, and
    # the label said "one device".
    b = OpGraphBuilder()
    b.add_op("a", compute_us=100, output_bytes=[1_000_000], device="/device:GPU:1")
    for i in range(4):
        b.add_op(f"x{i}", compute_us=100, output_bytes=[1_000_000], persistent_bytes=3_000_000)
        b.add_edge("a" if i == 0 else f"x{i - 1}", f"x{i}")
    small = Cluster((Device("/device:GPU:0", 10**9), Device("/device:GPU:1", 8_000_000)))
    r = place(b.build(), small, PlacementOptions(placement_method="m_etf"))
    assert r.single_device_count == 2 and one_device_label(r) == "one device + pins (2 devices)"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_full_disk_is_one_line_naming_the_output():
    # ENOSPC while --out was written was an OSError traceback and exit status 1.
    proc = subprocess.run(
        [sys.executable, "-m", "baechi_tf", "place-json", EXAMPLE, "--refine_seconds", "0", "--out", "/dev/full"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "baechi place-json: error: cannot write '/dev/full': No space left on device; free some "
        "space or write elsewhere\n"
    )


def test_an_output_error_gives_the_advice_that_fits_its_cause():
    # Every OSError said "free some space or write elsewhere", a permission error too.
    import errno

    from baechi_tf._files import output_error
    from baechi_tf.errors import OutputError

    cases = {
        errno.ENOSPC: "No space left on device; free some space or write elsewhere",
        errno.EACCES: "Permission denied; give this user write permission there, or write elsewhere",
        errno.EROFS: "Read-only file system; the file system is read-only; write elsewhere",
        errno.EIO: "Input/output error; write elsewhere",
    }
    for number, line in cases.items():
        e = output_error(OSError(number, os.strerror(number)), "out/p.json")
        assert isinstance(e, OutputError) and isinstance(e, OSError) and e.errno == number
        assert str(e) == f"cannot write 'out/p.json': {line}"


def test_a_disk_that_fills_while_the_outputs_are_written_leaves_them_as_they_were(tmp_path, capsys, monkeypatch):
    import errno

    import baechi_tf._files
    import baechi_tf.reports

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    out, reports = tmp_path / "p.json", tmp_path / "reports"
    out.write_text("earlier")
    monkeypatch.setattr(baechi_tf._files.os, "fsync", full)  # the os module: only while this test runs
    assert main(["place-json", EXAMPLE, "--refine_seconds", "0", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"baechi place-json: error: cannot write {str(out)!r}: No space left on device; free some "
        "space or write elsewhere\n"
    )
    monkeypatch.undo()
    monkeypatch.setattr(baechi_tf.reports, "_write_into", full)
    assert main(["place-json", EXAMPLE, "--refine_seconds", "0", "--report_dir", str(reports)]) == 2
    assert capsys.readouterr().err == (
        f"baechi place-json: error: cannot write {str(reports)!r}: No space left on device; free "
        "some space or write elsewhere\n"
    )
    assert sorted(os.listdir(tmp_path)) == ["p.json"] and out.read_text() == "earlier"
