"""Old module paths keep importing for one release (0.3): ``caravanserai.waypoints`` is ``caravanserai.runs.api``.

The package was reorganised into layers (``stores`` → ``calls`` → ``runs`` → ``agents`` →
``checkpoints``). Importing a module by its old path gives the module at its new path, the same
object, with a ``DeprecationWarning`` naming the new path. The table is fixed here: nothing read
from data chooses what is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

MOVED: dict[str, str] = {
    "caravanserai.ckpt_format": "caravanserai.checkpoints.format",
    "caravanserai.durable_agent": "caravanserai.checkpoints.agent",
    "caravanserai.identity": "caravanserai.runs.identity",
    "caravanserai.iterate": "caravanserai.runs.iterate",
    "caravanserai.legacy": "caravanserai.stores.local.legacy",
    "caravanserai.ledger": "caravanserai.calls.ledger",
    "caravanserai.models": "caravanserai.calls.models",
    "caravanserai.namespace": "caravanserai.runs.snapshots",
    "caravanserai.openai_client": "caravanserai.runs.openai_client",
    "caravanserai.pricing": "caravanserai.calls.pricing",
    "caravanserai.progress": "caravanserai.runs.progress",
    "caravanserai.serialization": "caravanserai.journal",
    "caravanserai.service": "caravanserai.stores.http_service",
    "caravanserai.stores.files": "caravanserai.stores.local.files",
    "caravanserai.stores.local_views": "caravanserai.stores.local.views",
    "caravanserai.summary": "caravanserai.runs.summary",
    "caravanserai.timelines": "caravanserai.checkpoints.timelines",
    "caravanserai.values": "caravanserai.runs.values",
    "caravanserai.views": "caravanserai.stores.local.views",
    "caravanserai.waypoints": "caravanserai.runs.api",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A finder for the old paths in ``MOVED``: the loader hands back the module at its new path."""

    def __init__(self) -> None:
        self._specs: dict[str, ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes away in the next release",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs[new] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # Already executed under its new name; the import system just gave it the old path's spec:
        # give its own back, so its relative imports keep resolving against its real package.
        module.__spec__ = self._specs.get(module.__name__, module.__spec__)
        module.__loader__ = module.__spec__.loader if module.__spec__ is not None else None


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
