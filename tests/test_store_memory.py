"""memory:// against the conformance suite."""

import uuid

import pytest

from caravanserai.stores import MemoryStore
from caravanserai.testing import StoreConformance, journal_machine


class TestMemoryStore(StoreConformance):
    @pytest.fixture
    def store(self):
        yield MemoryStore(uuid.uuid4().hex)

    @pytest.fixture
    def store_url(self):
        return f"memory://{uuid.uuid4().hex}"


TestMemoryJournalMachine = journal_machine(lambda: MemoryStore(uuid.uuid4().hex)).TestCase
