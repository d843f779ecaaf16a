"""The models of the original workflow, built from plain ``tf.compat.v1`` ops.

``build_model(name, hparams)`` builds a model into a fresh ``tf.Graph`` and returns a
`ModelSpec`: the loss (the forward target), the logits, placeholder inputs with synthetic values
to feed, and the model's hand ("expert") layout. Building the same hyper-parameters twice gives
the same GraphDef, byte for byte, which is what lets a profile be matched to a rebuilt graph.

Inputs are placeholders fed with fixed-seed synthetic data (``spec.feeds``), not the original's
``tf.data`` iterator of constants: the GraphDef stays small (an Inception batch would be a
constant of B*299*299*3 floats), Grappler cannot constant-fold the model away, no iterator op
pins the input to the CPU, and an imported (placed) copy of the GraphDef is fed by tensor name.

Models: ``gnmt_v2`` and ``gnmt`` (v1 attention) (`GNMTHParams`), ``inception_v3``
(`InceptionV3HParams`), ``transformer`` (`TransformerHParams`). The graphs carry no devices;
``spec.expert_placement(devices, graph)`` gives the hand layout as ``op -> device``.

The hyper-parameters (`models.hparams`) load without TensorFlow, so that a command line checks
its flags before TensorFlow loads; `build_model` loads it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from baechi_tf._lazy import lazy_attributes
from baechi_tf.errors import ConfigError
from baechi_tf.models.hparams import GNMTHParams, InceptionV3HParams, TransformerHParams

if TYPE_CHECKING:
    import tensorflow as tf

    from baechi_tf.models.layout import ExpertLayout
    from baechi_tf.models.spec import ModelSpec

__all__ = [
    "MODEL_NAMES",
    "ExpertLayout",
    "GNMTHParams",
    "InceptionV3HParams",
    "ModelSpec",
    "TransformerHParams",
    "build_model",
    "default_hparams",
    "flags_without_use",
    "hparams_from_flags",
]

MODEL_NAMES = ("gnmt_v2", "gnmt", "inception_v3", "transformer")

_HPARAMS = {
    "gnmt_v2": GNMTHParams,
    "gnmt": GNMTHParams,
    "inception_v3": InceptionV3HParams,
    "transformer": TransformerHParams,
}

# train.py flag -> (hyper-parameter field, conversion), where the names differ.
_FLAG_ALIASES = {"disable_nmt_colocation": ("colocation", lambda value: not value)}


def _check_name(name: str) -> None:
    if name not in _HPARAMS:
        raise ConfigError(f"unknown model {name!r}; use one of {', '.join(MODEL_NAMES)}")


def default_hparams(name: str) -> Any:
    """The default hyper-parameters of model `name` (its paper's or the original's size)."""
    _check_name(name)
    return _fix_variant(name, _HPARAMS[name]())


def hparams_from_flags(name: str, flag_values: Mapping[str, Any]) -> Any:
    """Hyper-parameters of model `name` from train.py's flag values.

    Takes every field of the model's dataclass found in `flag_values` (``batch_size``,
    ``vocab_size``, ``rnn_units``, ``data_format``, ...), maps ``disable_nmt_colocation`` to
    ``colocation``, keeps the defaults for the rest and ignores flags the model has no use for.
    """
    _check_name(name)
    cls = _HPARAMS[name]
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {key: value for key, value in flag_values.items() if key in fields}
    for flag, (field, convert) in _FLAG_ALIASES.items():
        if flag in flag_values and field in fields:
            values[field] = convert(flag_values[flag])
    return _fix_variant(name, cls(**values))


def flags_without_use(name: str, flag_names: Sequence[str]) -> list[str]:
    """The train.py flags among `flag_names` that model `name` has no use for (`hparams_from_flags`
    drops them): ``rnn_units`` for a Transformer, ``image_size`` for GNMT."""
    _check_name(name)
    fields = {f.name for f in dataclasses.fields(_HPARAMS[name])}
    return [
        flag for flag in flag_names
        if flag not in fields and not (flag in _FLAG_ALIASES and _FLAG_ALIASES[flag][0] in fields)
    ]


def _fix_variant(name: str, hparams: Any) -> Any:
    if name == "gnmt":
        return dataclasses.replace(hparams, use_new_attention=False)
    if name == "gnmt_v2":
        return dataclasses.replace(hparams, use_new_attention=True)
    return hparams


def build_model(
    name: str, hparams: Optional[Any] = None, *, graph: Optional[tf.Graph] = None
) -> ModelSpec:
    """Builds model `name` into `graph` (default: a new ``tf.Graph``; it should be empty).

    `hparams` is the model's dataclass (default: `default_hparams(name)`).
    """
    _check_name(name)
    if hparams is None:
        hparams = default_hparams(name)
    if not isinstance(hparams, _HPARAMS[name]):
        raise ConfigError(
            f"model {name!r} takes {_HPARAMS[name].__name__}, not {type(hparams).__name__}"
        )
    hparams = _fix_variant(name, hparams)
    import tensorflow as tf

    graph = tf.Graph() if graph is None else graph
    if name in ("gnmt_v2", "gnmt"):
        from baechi_tf.models.gnmt_v2 import build_gnmt

        return build_gnmt(hparams, graph, name)
    if name == "inception_v3":
        from baechi_tf.models.inception_v3 import build_inception_v3

        return build_inception_v3(hparams, graph)
    from baechi_tf.models.transformer import build_transformer

    return build_transformer(hparams, graph)


# The types of the built models load TensorFlow: only when they are used.
_LAZY = {"ExpertLayout": "baechi_tf.models.layout", "ModelSpec": "baechi_tf.models.spec"}
__getattr__ = lazy_attributes(__name__, _LAZY, globals())
