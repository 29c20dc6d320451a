"""Expiring leases for shared stores: renewed in the background, trusted only until a deadline.

A shared backend (SQLite, PostgreSQL, object storage, HTTP) grants a lease for ``ttl`` seconds and
a fencing ``token`` that grows on every takeover. The holder renews at a third of the TTL from a
daemon thread. It trusts its lease only until ``start of the last successful renew + 0.9 × ttl``
(its own monotonic clock): past that deadline ``held`` is False and an append is refused until a
renewal succeeds, so a paused process (SIGSTOP, a laptop lid) writes nothing when it wakes before
the store has said the lease is still its own. A late renewal may still succeed: every backend's
renewal is conditional on the token (SQL, the journal service) or the lease object's version
(object storage) being unchanged, which is exactly "no other holder took it", so an overloaded or
briefly paused writer keeps its run unless somebody else took it over (then ``LeaseLost``). Safety
does not rest on clocks alone: every backend also *fences* appends with the token (SQL) or
write-once journal keys (object storage), so a stale holder's append is rejected by the store itself.

Every backend takes its TTL as ``lease_ttl_ms`` and checks it here, with ``check_lease_ttl``: one
minimum (``MIN_TTL_MS``, 3000 ms: renewing at a third of it leaves a second of slack) and one
error, ``LeaseTtlInvalid`` (the object store raises its seed-named subclass
``ObjectLeaseTtlInvalid``).
"""

from __future__ import annotations

import threading
import time
import weakref
from abc import abstractmethod
from typing import Any

from ..errors import LeaseLost, LeaseTtlInvalid
from .base import ABANDONED_LEASES, Lease

MIN_TTL_MS = 3000
MIN_TTL = MIN_TTL_MS / 1000  # seconds, for callers of the earlier name
DEFAULT_TTL_MS = 30_000


def check_lease_ttl(ttl_ms: object, *, error: type[LeaseTtlInvalid] = LeaseTtlInvalid,
                    option: str = "lease_ttl_ms") -> int:
    """``ttl_ms`` as an int if it is a whole number of milliseconds of at least ``MIN_TTL_MS``.

    Otherwise ``error`` (``LeaseTtlInvalid`` or a subclass a backend names), one line, naming
    ``option`` (the argument or URL option the value came from).
    """
    if isinstance(ttl_ms, float) and ttl_ms.is_integer():
        ttl_ms = int(ttl_ms)
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int):
        raise error(f"{option} must be a whole number of milliseconds, at least {MIN_TTL_MS}ms (got {ttl_ms!r})",
                    lease_ttl_ms=repr(ttl_ms), option=option, minimum=MIN_TTL_MS)
    if ttl_ms < MIN_TTL_MS:
        raise error(f"{option}: the lease must be at least {MIN_TTL_MS}ms (got {ttl_ms}ms)", lease_ttl_ms=ttl_ms,
                    option=option, minimum=MIN_TTL_MS)
    return int(ttl_ms)


class ExpiringLease(Lease):
    """A lease with a TTL: background renewal, a local deadline, backend-specific renew/release."""

    def __init__(self, store: Any, run_id: str, token: int, holder: dict[str, Any], ttl: float, *, started: float,
                 next_seq: int = 0) -> None:
        super().__init__(store, run_id, token, holder, next_seq)
        self.ttl = ttl
        self._deadline = started + 0.9 * ttl
        self._lost: str | None = None
        # one renewal at a time: the append path and the background thread both renew, and on object
        # storage two concurrent compare-and-swaps of the same version make the loser think its own
        # lease was taken over
        self._renewing = threading.RLock()  # reentrant: a release may compact, which may renew
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=_renew_loop, args=(weakref.ref(self), self._stop, ttl / 3),
                                         name=f"caravanserai-lease-{run_id}", daemon=True)
        self._renewer.start()

    @property
    def held(self) -> bool:
        return not self._released and self._lost is None and time.monotonic() < self._deadline

    @property
    def renewable(self) -> bool:
        return not self._released and self._lost is None

    def check(self) -> None:
        if self._lost is not None and not self._released:
            raise LeaseLost(f"the lease on run {self.run_id!r} was lost ({self._lost}); another writer may own the run "
                            "now: open it again", run_id=self.run_id)
        if not self._released and time.monotonic() >= self._deadline:
            raise LeaseLost(f"the lease on run {self.run_id!r} expired by this writer's clock before it was renewed "
                            "(paused or cut off from the store?); renew it (kept if no other writer took the run) or "
                            "open the run again", run_id=self.run_id)
        super().check()

    def renew(self) -> None:
        """Renew now if a third of the TTL has passed since the last renewal (cheap otherwise); past
        the deadline too, where the backend still grants it while no other holder took the run."""
        if self._lost is not None or self._released:
            self.check()
        deadline = self._deadline
        if time.monotonic() >= deadline - 0.6 * self.ttl:
            self._renew_now(seen=deadline)
        for _ in range(3):  # a renewal (this one or another thread's) slower than the lease proves too little
            if time.monotonic() < self._deadline or self._lost is not None:
                break
            self._renew_now()
        if self._lost is not None:  # lost in another thread while this one waited for the lock
            self.check()

    def _renew_now(self, seen: float | None = None) -> None:
        """Renew, unless another thread renewed while this one waited for the lock (the deadline it
        ``seen`` moved): two renewals at once would race each other's compare-and-swap."""
        with self._renewing:
            if (seen is not None and self._deadline != seen) or self._released or self._lost is not None:
                return
            started = time.monotonic()
            try:
                self._renew()
            except LeaseLost as exc:
                self._lost = str(exc)
                raise
            self._deadline = started + 0.9 * self.ttl
            if self._released:  # released while this renewal was stuck (the release gave up waiting for it)
                try:
                    self._release_remote()
                except Exception:
                    pass  # it expires on its own

    def _release(self) -> None:
        self._stop.set()
        # not in the middle of a renewal's compare-and-swap; but a renewal stuck on a store that does not
        # answer must not hold up the release (Ctrl-C, exit): then the lease expires on its own
        if not self._renewing.acquire(timeout=max(0.1, min(5.0, self._deadline - time.monotonic()))):
            self._abandon()
            return
        try:
            if self._lost is None:
                try:
                    self._release_remote()
                except Exception:  # it expires on its own; this process may take it over before that
                    self._abandon()
        finally:
            self._renewing.release()

    def _abandon(self) -> None:
        if isinstance(self.holder.get("lease"), str):
            ABANDONED_LEASES.add(self.holder["lease"])

    @abstractmethod
    def _renew(self) -> None:
        """Extend the lease in the backend; LeaseLost if it is no longer ours."""

    @abstractmethod
    def _release_remote(self) -> None:
        """Give the lease up in the backend (best effort)."""


def _renew_loop(ref: weakref.ref[ExpiringLease], stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        lease = ref()
        if lease is None or lease._released or lease._lost is not None:
            return
        try:
            lease._renew_now(seen=lease._deadline)  # every ttl/3, unless the append path renews meanwhile
        except LeaseLost:
            return
        except Exception:
            pass  # a transient failure: the deadline decides; the next tick retries
        del lease
