"""The placement options' flags: one schema (baechi_tf.options) for argparse and absl."""

import argparse
import dataclasses

import pytest
from absl import flags

from baechi_tf.cli import add_placement_arguments, options_from_args
from baechi_tf.errors import ConfigError
from baechi_tf.options import FLAGS, NOT_FLAGS, add_arguments, define_absl_flags, options_from
from baechi_tf.placer.pipeline import PlacementOptions
from baechi_tf.ranges import SHARE_OF_MEMORY, Range, check_range


def absl_values(*argv):
    values = flags.FlagValues()
    define_absl_flags(flags, values, names=tuple(f.field for f in FLAGS), any_value=("placement_method",))
    values(["prog", *argv])
    return {f.flag: values[f.flag].value for f in FLAGS}


def argparse_values(*argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    return {f.flag: getattr(args, f.flag) for f in FLAGS}


def test_every_field_is_a_flag_or_says_why_not():
    fields = {f.name for f in dataclasses.fields(PlacementOptions)}
    flagged = [f.field for f in FLAGS]
    assert len(flagged) == len(set(flagged))
    assert set(flagged) | set(NOT_FLAGS) == fields
    assert not set(flagged) & set(NOT_FLAGS)


def test_both_parsers_give_the_fields_defaults():
    assert options_from(argparse_values()) == PlacementOptions()
    assert options_from(absl_values()) == PlacementOptions()


def test_both_parsers_give_the_same_options_and_types():
    argv = ["--placement_method=m_sct", "--grouper=coplace", "--sct_threshold=0.25", "--lp_time_limit=9",
            "--placement_jobs=2", "--auto_work=1000", "--engine=python", "--placer_memory_fraction=0.5"]
    from_argparse, from_absl = argparse_values(*argv), absl_values(*argv)
    assert from_argparse == from_absl
    assert {k: type(v) for k, v in from_argparse.items()} == {k: type(v) for k, v in from_absl.items()}
    options = options_from(from_absl)
    assert (options.placement_method, options.memory_fraction, options.auto_work) == ("m_sct", 0.5, 1000)


@pytest.mark.parametrize("value, shown", [("2", "2"), ("0", "0"), ("-0.5", "-0.5"), ("nan", "nan"), ("1.25", "1.25")])
def test_a_memory_fraction_out_of_range_is_one_message_in_both_parsers(value, shown):
    message = (f"--placer_memory_fraction={shown} must be in (0, 1]: the share of each device's memory the "
               "placer may fill (1 fills it all)")
    for values in (argparse_values(f"--placer_memory_fraction={value}"), absl_values(f"--placer_memory_fraction={value}")):
        with pytest.raises(ConfigError) as e:
            options_from(values)
        assert str(e.value) == message


def test_the_cli_refuses_expert_and_keeps_report_dir():
    parser = argparse.ArgumentParser()
    add_placement_arguments(parser)
    choices = next(a.choices for a in parser._actions if a.dest == "placement_method")
    assert "expert" not in choices and "auto" in choices
    args = parser.parse_args(["--report_dir", "r", "--seed", "3"])
    assert args.report_dir == "r" and options_from_args(args).seed == 3


def test_other_bad_values_are_placement_options_own_message():
    with pytest.raises(ConfigError, match="placement_jobs -2 must be a whole number >= 0"):
        options_from(absl_values("--placement_jobs=-2"))
    with pytest.raises(ConfigError, match="unknown placement method 'magic'"):
        options_from(absl_values("--placement_method=magic"))


def test_check_range():
    check_range("x", 1, SHARE_OF_MEMORY)
    check_range("x", 0.001, SHARE_OF_MEMORY)
    for bad in (0, 0.0, 1.5, float("nan"), True, "0.5", None):
        with pytest.raises(ConfigError, match=r"^x=.* must be in \(0, 1\]$"):
            check_range("x", bad, SHARE_OF_MEMORY)
    with pytest.raises(ConfigError, match=r"^y=1 must be in \[0, 1\): a threshold$"):
        check_range("y", 1.0, Range(0.0, 1.0, high_in=False, meaning="a threshold"))
    assert str(Range(0, 2)) == "[0, 2]"


def test_device_shares_are_checked_by_the_same_check():
    from baechi_tf.cluster import Cluster

    with pytest.raises(ConfigError, match=r"^memory_fraction=0 must be in \(0, 1\]$"):
        Cluster.homogeneous(1, 1 << 30).with_memory_fraction(0)
