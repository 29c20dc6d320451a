"""Expiring leases for shared stores: renewed in the background, trusted only until a deadline.

A shared backend (SQLite, PostgreSQL, object storage, HTTP) grants a lease for ``ttl`` seconds and
a fencing ``token`` that grows on every takeover. The holder renews at a third of the TTL from a
daemon thread. It trusts its lease only until ``start of the last successful renew + 0.9 × ttl``
(its own monotonic clock): past that deadline ``held`` is False and appends raise ``LeaseLost``,
so a paused process (SIGSTOP, a laptop lid) stops writing when it wakes. Safety does not rest on
clocks alone: every backend also *fences* appends with the token (SQL) or write-once journal keys
(object storage), so a stale holder's append is rejected by the store itself.
"""

from __future__ import annotations

import threading
import time
import weakref
from abc import abstractmethod
from typing import Any

from ..errors import LeaseLost
from .base import Lease

MIN_TTL = 3.0


class ExpiringLease(Lease):
    """A lease with a TTL: background renewal, a local deadline, backend-specific renew/release."""

    def __init__(self, store: Any, run_id: str, token: int, holder: dict[str, Any], ttl: float, *, started: float) -> None:
        super().__init__(store, run_id, token, holder)
        self.ttl = ttl
        self._deadline = started + 0.9 * ttl
        self._lost: str | None = None
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=_renew_loop, args=(weakref.ref(self), self._stop, ttl / 3),
                                         name=f"caravanserai-lease-{run_id}", daemon=True)
        self._renewer.start()

    @property
    def held(self) -> bool:
        return not self._released and self._lost is None and time.monotonic() < self._deadline

    def check(self) -> None:
        if self._lost is not None and not self._released:
            raise LeaseLost(f"the lease on run {self.run_id!r} was lost ({self._lost}); another writer may own the run "
                            "now: open it again", run_id=self.run_id)
        if not self._released and time.monotonic() >= self._deadline:
            raise LeaseLost(f"the lease on run {self.run_id!r} expired before it could be renewed (paused or cut off "
                            "from the store?); open the run again", run_id=self.run_id)
        super().check()

    def renew(self) -> None:
        """Renew now if a third of the TTL has passed since the last renewal (cheap otherwise)."""
        self.check()
        if time.monotonic() >= self._deadline - 0.6 * self.ttl:
            self._renew_now()

    def _renew_now(self) -> None:
        started = time.monotonic()
        if started >= self._deadline:
            self._lost = "its deadline passed before a renewal"
            self.check()
        try:
            self._renew()
        except LeaseLost as exc:
            self._lost = str(exc)
            raise
        self._deadline = started + 0.9 * self.ttl

    def _release(self) -> None:
        self._stop.set()
        if self._lost is None:
            try:
                self._release_remote()
            except Exception:
                pass  # it expires on its own

    @abstractmethod
    def _renew(self) -> None:
        """Extend the lease in the backend; LeaseLost if it is no longer ours."""

    @abstractmethod
    def _release_remote(self) -> None:
        """Give the lease up in the backend (best effort)."""


def _renew_loop(ref: "weakref.ref[ExpiringLease]", stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        lease = ref()
        if lease is None or lease._released or lease._lost is not None:
            return
        try:
            lease._renew_now()
        except LeaseLost:
            return
        except Exception:
            pass  # a transient failure: the deadline decides; the next tick retries
        del lease
