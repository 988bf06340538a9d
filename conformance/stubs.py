"""Stand-ins for the few modules SGLang 0.5.23 imports at load time that a CPU box cannot load.

Everything else `sglang.srt.entrypoints.http_server` imports is the real package, installed by
`conformance/setup.sh` (pinned in `conformance/requirements.txt`). Each stub below names why.

- ``torchvision``: PyPI ships only CUDA builds of torchvision (0.28.0 pairs with torch 2.13.0);
  its ``_C`` extension cannot register ``torchvision::nms`` against the CPU torch wheel, so
  ``import torchvision`` raises at load. SGLang imports it at module level only for image
  preprocessing (``sglang/srt/multimodal/internvl_utils.py:5,7``, reached from
  ``sglang/srt/configs/__init__.py:71``); no text-only ``/generate`` path calls it. The stub is a
  package whose every attribute is a placeholder that raises if it is ever called, and it
  reports version ``0.0.0+stub`` so transformers' version checks take their "too old" branch.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

STUBBED = ("torchvision",)


class _Unavailable:
    """A placeholder attribute: usable in annotations and class bases, raises when called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name} is stubbed in the conformance harness (no CPU build)")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self.__name__}.{attr}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        module.__version__ = "0.0.0+stub"  # type: ignore[attr-defined]


def install() -> None:
    """Put the stubs in front of the import system (idempotent)."""
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder(STUBBED))
