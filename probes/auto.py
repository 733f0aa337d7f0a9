"""The one line a transformers.Trainer or Lightning script adds: ``import probes.auto``.

From then on, every Trainer this process builds carries the probe callback of :mod:`probes.emit`, through each
library's own way of adding a callback to every Trainer:

- transformers: the callback class joins ``transformers.trainer.DEFAULT_CALLBACKS`` (the list every Trainer starts
  its callbacks from), now if ``transformers.trainer`` is imported, else the moment it is;
- Lightning: the ``lightning.pytorch.callbacks_factory`` / ``pytorch_lightning.callbacks_factory`` entry points of
  this package (:mod:`probes.emit_lightning`) return the callback in a process that imported this module.

Why an import rather than ``trainer.add_callback(probes.emit.hf_callback())``: that needs its own import line, and
one line more for every Trainer the script builds. The import works whatever the launcher (python, torchrun,
accelerate launch), before or after the script imports its trainer. A process that imported this module and
started no session says so on stderr when it exits, so a line that reached no trainer is never silent.
A plain loop has no callbacks: it calls ``probes.emit.step(...)`` in the loop instead.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable

from probes import emit

_HF_MODULE = "transformers.trainer"


def attach_hf(module: ModuleType) -> None:
    """Add the probe callback class to ``module.DEFAULT_CALLBACKS`` (once)."""
    callbacks = getattr(module, "DEFAULT_CALLBACKS", None)
    if not isinstance(callbacks, list):
        raise ImportError(
            f"probes.auto: {module.__name__}.DEFAULT_CALLBACKS is not a list in this transformers version; "
            "add the callback by hand: trainer.add_callback(probes.emit.hf_callback())"
        )
    from probes.emit_hf import ProbeCallback

    if ProbeCallback not in callbacks:
        callbacks.append(ProbeCallback)


class _Loader(importlib.abc.Loader):
    """The module's own loader, then ``then(module)``; every other attribute (get_source for tracebacks) is its."""

    def __init__(self, inner: Any, then: Callable[[ModuleType], None]) -> None:
        self._inner, self._then = inner, then

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._then(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then`` on module ``name`` right after its first import, then leaves ``sys.meta_path``."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then, self._busy = name, then, False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self._busy:
            return None
        self._busy = True  # the real finders answer the lookup below, not this one again
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec.loader = _Loader(spec.loader, self.then)
        return spec


def _warn_if_unused() -> None:
    if emit.sessions_started == 0:
        print(
            "probes.auto: imported, but no transformers.Trainer or Lightning Trainer trained in this process, so no "
            "SPECPROBE_STEP line was printed (a plain loop calls probes.emit.step(...) itself)",
            file=sys.stderr,
            flush=True,
        )


if _HF_MODULE in sys.modules:
    attach_hf(sys.modules[_HF_MODULE])
else:
    sys.meta_path.insert(0, _AfterImport(_HF_MODULE, attach_hf))
atexit.register(_warn_if_unused)
