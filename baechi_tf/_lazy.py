"""Attributes of a package that load their module on first use (PEP 562): the parts that import
TensorFlow, which takes seconds, stay out of a plain ``import``."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_attributes(package: str, modules: Mapping[str, str], namespace: dict) -> Callable[[str], Any]:
    """A module ``__getattr__`` for `package`: attribute ``name`` is imported from the module
    ``modules[name]`` when first asked for, then kept in `namespace` (the package's globals)."""

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
