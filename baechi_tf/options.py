"""The placement options as command-line flags: one schema for every command.

Each `Flag` names a `PlacementOptions` field and says what its flag shows a user: the help, the
values it allows, the range a number must lie in. The field's type and default come from
`PlacementOptions` itself, so a flag cannot drift from its field. From the schema,
`add_arguments` makes the argparse flags of ``baechi place`` and ``baechi place-json``,
`define_absl_flags` makes the absl flags of ``train.py``, and `options_from` builds the
`PlacementOptions` that flag values give: a range is checked once, by `check_range`, with one
message that names the flag (`baechi_tf.ranges`); the rest is `PlacementOptions.validate`.

To give a new `PlacementOptions` field a flag in every command, add one `Flag` to `FLAGS`; a
field that is no flag goes in `NOT_FLAGS`, with why (tests/test_options.py holds the two to
the dataclass). Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Callable, Mapping, Optional

from baechi_tf.placer.grouping import GROUPERS
from baechi_tf.placer.pipeline import ENGINES, LP_SOLVERS, PLACEMENT_METHODS, PlacementOptions
from baechi_tf.ranges import SHARE_OF_MEMORY, Range, check_range

__all__ = ["FLAGS", "NOT_FLAGS", "Flag", "add_arguments", "define_absl_flags", "options_from"]


@dataclasses.dataclass(frozen=True)
class Flag:
    """The flag of one `PlacementOptions` field."""

    field: str  # the PlacementOptions field it sets
    help: str  # what it does, without its default
    name: str = ""  # the flag's name, when it is not the field's
    choices: tuple[str, ...] = ()  # the values it allows (empty: any of its type)
    range: Optional[Range] = None  # the numbers it allows, checked by `options_from`
    metavar: Optional[str] = None
    default_help: str = "%(default)s"  # its default as the help says it (%(default)s: the value)

    @property
    def flag(self) -> str:
        """The flag's name, without dashes."""
        return self.name or self.field

    @property
    def type(self) -> type:
        """The field's type: str, int or float (an Optional one's inner type)."""
        hint = typing.get_type_hints(PlacementOptions)[self.field]
        inner = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
        return inner[0]

    @property
    def default(self) -> Any:
        return getattr(_DEFAULTS, self.field)

    def help_with_default(self) -> str:
        """`help` and its default, as argparse expands it (%(default)s)."""
        return f"{self.help} (default: {self.default_help})"


_DEFAULTS = PlacementOptions()

# In the order the commands list them.
FLAGS: tuple[Flag, ...] = (
    Flag(
        "placement_method",
        "placement algorithm; 'auto' runs every placer, keeps the best simulated placement and "
        "refines it",
        choices=tuple(sorted(PLACEMENT_METHODS)),
    ),
    Flag(
        "grouper",
        "'tf': keep TF colocation groups together; 'coplace': also put an op with a single "
        "consumer next to it",
        choices=tuple(GROUPERS),
    ),
    Flag(
        "placer_type",
        "'fusion' places a graph in which connected ops of one group are fused first",
        choices=("default", "fusion"),
    ),
    Flag("sct_threshold", "m-SCT: an LP edge value at or below this makes a favourite child"),
    Flag(
        "lp_solver",
        "m-SCT's LP solver; 'auto' takes MOSEK when licensed, else HiGHS (cvxopt first for an "
        "LP of over 5000 arcs whose normal equations are sparse), and the next one when a solver "
        "fails",
        choices=tuple(LP_SOLVERS),
    ),
    Flag(
        "lp_time_limit",
        "m-SCT: seconds each LP solve may take (HiGHS, MOSEK); with --lp_solver=auto a solver "
        "that fails or runs out of time hands the LP to the next one",
        default_help="no limit",
    ),
    Flag(
        "refine_seconds",
        "auto: time for the refinement that moves groups while the simulated step time drops; 0 "
        "turns it off",
    ),
    Flag("seed", "auto: seed of the refinement"),
    Flag(
        "placement_jobs",
        "auto: worker processes that place its candidates side by side; 0 chooses one per core on "
        "graphs of 4,000 ops or more, 1 places them all in this process; the placement is the same "
        "either way",
        metavar="N",
    ),
    Flag(
        "placement_timeout_s",
        "auto: wall-clock seconds after which no further placer starts and refinement stops; the "
        "best placement found by then is kept, with a warning naming what did not run",
        metavar="SECONDS",
        default_help="no limit, so that the same inputs give the same placement on any machine",
    ),
    Flag(
        "auto_work",
        "auto: units of scheduling work (a scheduling step or a dry run of an op on a device; a "
        "copy 1.5) for all of auto: half shared equally by its placers, each stopped when its runs "
        "would pass its share, the rest for refinement (at most what --refine_seconds buys). The "
        "same units give the same placement on any machine",
        metavar="UNITS",
        default_help="each placer 40 units per op and edge plus 400,000, refinement "
        "--refine_seconds' own",
    ),
    Flag(
        "engine",
        "what runs the list scheduler that m-ETF, m-SCT, the simulator and auto's refinement "
        "share: 'native', the compiled core, or 'python', the reference it is tested against; the "
        "placement is the same either way",
        choices=tuple(ENGINES),
        default_help="%(default)s; 'python', with a warning, when the core was not built",
    ),
    Flag(
        "memory_fraction",
        "share of each device's memory the placer may fill, in (0, 1]",
        # BaechiSession(memory_fraction=) and train.py's --memory_fraction are another share:
        # of the device, which the placer's is a share of.
        name="placer_memory_fraction",
        range=dataclasses.replace(
            SHARE_OF_MEMORY, meaning="the share of each device's memory the placer may fill (1 fills it all)"
        ),
    ),
)

# The PlacementOptions fields that are no flag of every command, and why.
NOT_FLAGS: Mapping[str, str] = {
    "expert": "a layout (op name -> device) is no flag value: train.py takes its model's own",
    "fusion_path_check": "train.py's --fusion_check_disjoint_paths sets it to 'exact'",
}


def add_arguments(
    parser: argparse.ArgumentParser, *, types: Optional[Mapping[str, Callable[[str], Any]]] = None,
    without: Mapping[str, tuple[str, ...]] = {},
) -> None:
    """Adds an argparse flag of each of `FLAGS` to `parser`, with its default and choices.
    `types` gives a field's flag another argparse type (one that refuses a value with a reason);
    `without` leaves values out of a field's choices (those a command cannot be given)."""
    for flag in FLAGS:
        kwargs: dict[str, Any] = {"default": flag.default, "help": flag.help_with_default()}
        if flag.choices:
            kwargs["choices"] = tuple(c for c in flag.choices if c not in without.get(flag.field, ()))
        if flag.type is not str:
            kwargs["type"] = flag.type
        if types and flag.field in types:
            kwargs["type"] = types[flag.field]
        if flag.metavar:
            kwargs["metavar"] = flag.metavar
        parser.add_argument(f"--{flag.flag}", **kwargs)


def define_absl_flags(
    flags: Any, flag_values: Any, *, names: tuple[str, ...], any_value: tuple[str, ...] = (),
    more_choices: Mapping[str, tuple[str, ...]] = {},
) -> None:
    """Defines in `flag_values` (absl's ``FLAGS``; `flags` is ``absl.flags``) an absl flag of each
    field of `names`, in that order, with its default. A flag with choices is an enum, but those
    of `any_value` (whose values `PlacementOptions.validate` judges, with a reason) and with
    `more_choices` added (values the command refuses with a reason of its own). The caller
    declares them its key flags (``flags.declare_key_flag``) for its ``--help`` to list them."""
    by_field = {flag.field: flag for flag in FLAGS}
    for field in names:
        flag = by_field[field]
        default_help = flag.default_help.replace("%(default)s", str(flag.default))
        help_text = f"{flag.help}." if flag.default_help == "%(default)s" else f"{flag.help}. Default: {default_help}."
        if flag.choices and field not in any_value:
            choices = [*flag.choices, *more_choices.get(field, ())]
            flags.DEFINE_enum(flag.flag, flag.default, choices, help_text, flag_values=flag_values)
        elif flag.choices:
            help_text = f"One of {', '.join(flag.choices)}: {help_text}"
            flags.DEFINE_string(flag.flag, flag.default, help_text, flag_values=flag_values)
        else:
            define = {str: flags.DEFINE_string, int: flags.DEFINE_integer, float: flags.DEFINE_float}[flag.type]
            define(flag.flag, flag.default, help_text, flag_values=flag_values)


def options_from(values: Mapping[str, Any], **fixed: Any) -> PlacementOptions:
    """The `PlacementOptions` of flag values (`values`: flag name without dashes -> value, for
    the flags of `FLAGS` a command has) and of the fields `fixed` gives, validated: a value out
    of its flag's range is a `ConfigError` naming the flag (`check_range`), any other bad value
    `PlacementOptions.validate`'s."""
    fields = dict(fixed)
    for flag in FLAGS:
        if flag.flag not in values:
            continue
        value = values[flag.flag]
        if flag.range is not None:
            check_range(f"--{flag.flag}", value, flag.range)
        fields[flag.field] = value
    options = PlacementOptions(**fields)
    options.validate()
    return options
