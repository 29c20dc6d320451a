"""Test kit shipped with the package: ``ScriptedModel`` and the store conformance suite.

``caravanserai.testing.conformance`` needs pytest (and Hypothesis for the state machine); it is
imported only when its names are used, so ``ScriptedModel`` works without them.
"""

from .scripted import ScriptedModel

__all__ = ["ObjectStoreConformance", "ObjectsConformance", "ScriptedModel", "StoreConformance", "journal_machine",
           "make_lines"]


def __getattr__(name: str):
    if name in ("ObjectStoreConformance", "ObjectsConformance", "StoreConformance", "journal_machine", "make_lines"):
        from . import conformance

        return getattr(conformance, name)
    raise AttributeError(name)
