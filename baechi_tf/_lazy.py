"""Attributes of a package that load their module on first use (PEP 562): the parts that import
TensorFlow, which takes seconds, stay out of a plain ``import``."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable, Mapping

from baechi_tf.errors import TensorFlowMissingError


def require_tensorflow(what: str) -> None:
    """Raises `TensorFlowMissingError` saying that `what` needs TensorFlow when no module
    ``tensorflow`` can be found, and how to install it; it imports nothing. TensorFlow is an
    extra of baechi_tf (setup.py): `cpu` or `gpu`."""
    if importlib.util.find_spec("tensorflow") is None:
        raise TensorFlowMissingError(
            f"{what} needs TensorFlow, which is not installed: install baechi_tf with the extra "
            "for this machine, pip install 'baechi_tf[cpu]' (tensorflow-cpu) or, with NVIDIA GPUs, "
            "pip install 'baechi_tf[gpu]' (tensorflow[and-cuda]); in a checkout, make chooses one. "
            "The placers and baechi place-json need no TensorFlow",
            name="tensorflow",
        )


def lazy_attributes(package: str, modules: Mapping[str, str], namespace: dict) -> Callable[[str], Any]:
    """A module ``__getattr__`` for `package`: attribute ``name`` is imported from the module
    ``modules[name]`` when first asked for, then kept in `namespace` (the package's globals).
    Those modules are TensorFlow's ends: without TensorFlow, asking for one raises
    `TensorFlowMissingError` (`require_tensorflow`)."""

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        require_tensorflow(f"{package}.{name}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
