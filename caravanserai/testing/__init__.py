"""Test kit shipped with the package: the store conformance suite (needs pytest, Hypothesis)."""

from .conformance import StoreConformance, journal_machine, make_lines

__all__ = ["StoreConformance", "journal_machine", "make_lines"]
