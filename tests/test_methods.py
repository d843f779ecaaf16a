"""The registry of placement methods (`placer.methods`): one immutable table that the command
line, `PlacementOptions`, auto's portfolio and the docs all read."""

import os

import pytest

import graphs
from baechi_tf.errors import ConfigError
from baechi_tf.placer import methods as registries
from baechi_tf.placer.m_topo import place_m_topo
from baechi_tf.placer.methods import BUILTIN, PLACEMENT_METHODS, register_method
from baechi_tf.placer.pipeline import PlacementOptions, place

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_registry_cannot_be_changed_in_place():
    with pytest.raises(TypeError):
        BUILTIN["m_topo"] = BUILTIN["m_etf"]
    with pytest.raises(AttributeError, match="immutable"):
        BUILTIN.portfolio = ()
    with pytest.raises(AttributeError):
        BUILTIN["m_etf"].cutoff = False  # a frozen record
    with pytest.raises(TypeError):
        PLACEMENT_METHODS["probe"] = place_m_topo


def test_registering_swaps_in_a_new_registry_and_leaves_the_built_in_one(methods):
    before = dict(BUILTIN)

    def mine(graph, cluster, groups, options):
        return place_m_topo(graph, cluster, groups)

    register_method("m_etf", mine)
    register_method("probe", mine)
    assert dict(BUILTIN) == before
    registry = registries.current()
    assert registry is not BUILTIN
    assert list(registry)[: len(before)] == list(before)  # a replaced method keeps its place
    assert list(registry)[-1] == "probe"
    # Replaced, m-ETF is no longer the built-in: no cutoff, no schedule of its own.
    assert not registry["m_etf"].cutoff and registry["m_etf"].own_schedule is None
    assert PLACEMENT_METHODS["m_etf"] is mine and PLACEMENT_METHODS["probe"] is mine
    PlacementOptions(placement_method="probe").validate()
    assert place(graphs.chain(), graphs.cluster(2), PlacementOptions("m_etf")).placement.method == "m_topo"


def test_every_built_in_method_says_where_it_comes_from_and_when_to_use_it():
    for name, method in BUILTIN.items():
        assert method.name == name
        assert method.paper and method.does and method.when and method.needs, name
    assert set(BUILTIN.portfolio) <= set(BUILTIN)
    assert BUILTIN.in_portfolio() == list(BUILTIN.portfolio)
    assert {m for m in BUILTIN if BUILTIN[m].cutoff} == {"m_etf", "m_sct"}
    assert {m for m in BUILTIN if BUILTIN[m].own_schedule} == {"m_etf", "single"}


def test_the_command_line_and_the_options_offer_the_registry_s_methods():
    import argparse

    from baechi_tf.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    flags = [
        a for sub in commands.values() for a in sub._actions if "--placement_method" in a.option_strings
    ]
    assert flags
    for flag in flags:
        assert sorted(flag.choices) == sorted(set(BUILTIN) - {"expert"})
    with pytest.raises(ConfigError, match="unknown placement method 'm_nope'; choose one of " + ", ".join(sorted(BUILTIN))):
        PlacementOptions(placement_method="m_nope").validate()
    with pytest.raises(ConfigError, match="'m_etf_reserve' is the original's, not ported: .* Use m_etf"):
        PlacementOptions(placement_method="m_etf_reserve").validate()
    assert registries.not_ported("m_etf") is None


def test_the_docs_table_is_the_registry():
    table = registries.methods_table()
    rows = table.splitlines()[2:]
    assert [row.split("|")[1].strip() for row in rows] == [f"`{m}`" for m in BUILTIN]
    assert "| `m_sct` | Baechi, section 4.3; SCT: Hanen and Munier" in table
    with open(os.path.join(ROOT, "docs", "methods.md")) as f:
        assert "<!-- methods-table -->" in f.read()  # replaced by docs/hooks/tables.py
