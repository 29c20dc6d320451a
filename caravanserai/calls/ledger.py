"""What a run spent, and which journaled calls a resumed attempt may replay.

The ledger reads a run's journal once when the run opens: it restores the **meter** (calls,
tokens, inferred USD) from every settled call — revalidating each figure, because a store is a
trust boundary — and it builds the **replay window**: the calls journaled after the last
boundary (a waypoint or a conversation turn), which the resumed code is about to make again.
A settled call in the window is returned from the journal without being sent; a call that
started but never settled may have been billed, so it counts in ``possible_double_count_calls``.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .._html import bundle, table
from ..errors import BudgetExceeded, JournalCorruptionError
from ..events import BOUNDARIES, CALL_EVENTS, SEGMENT_EVENTS, Segments
from ..journal import digest
from .pricing import PRICE_LABEL, estimate_usd, usd_text

__all__ = ["Budget", "CallRecord", "Ledger", "Receipt", "ResumeInfo", "calls_text", "completed_receipt", "digest"]


def _some(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def calls_text(model: int, tool: int = 0, unanswered: int = 0) -> str:
    """How many calls a run made, in the words ``show``, the Runs panel and receipts all use.

    ``model``: model calls answered (settled: the ones a receipt lists, with tokens and USD);
    ``tool``: tool calls answered; ``unanswered``: calls of either kind with no answer journaled
    (failed, or pending: in flight, or cut by a kill). A call answered from the journal on a later
    attempt (a replay) is the same call, not a new one. ``3 calls (2 model, 1 tool)``; ``2 model
    calls`` when there is nothing else; ``no calls``.
    """
    if not tool and not unanswered:
        return _some(model, "model call") if model else "no calls"
    parts = [f"{count} {what}" for count, what in ((model, "model"), (tool, "tool"), (unanswered, "unanswered")) if count]
    return f"{_some(model + tool + unanswered, 'call')} ({', '.join(parts)})"


def receipt_usd_text(usd: float, calls: int, unpriced: int) -> str:
    """A receipt's total: ``$0.00042``, ``$0.00042 + unpriced calls``, or ``unpriced`` (no call had a price)."""
    if calls and unpriced == calls:
        return "unpriced"
    return usd_text(usd) + (" + unpriced calls" if unpriced else "")



@dataclass(frozen=True)
class Budget:
    """Spending limits of a run (any subset). Part of the run's identity: changing it is BudgetChanged."""

    usd: float | None = None
    tokens: int | None = None
    calls: int | None = None

    @classmethod
    def of(cls, value: Budget | dict | None) -> Budget | None:
        if value is None or isinstance(value, Budget):
            return value
        if not isinstance(value, dict) or set(value) - {"usd", "tokens", "calls"}:
            raise ValueError(f"budget must be a dict with keys usd, tokens, calls; got {value!r}")
        budget = cls(value.get("usd"), value.get("tokens"), value.get("calls"))
        for name in ("usd", "tokens", "calls"):
            limit = getattr(budget, name)
            if limit is not None and not (isinstance(limit, (int, float)) and not isinstance(limit, bool)
                                          and math.isfinite(limit) and limit >= 0):
                raise ValueError(f"budget {name}={limit!r} must be a finite number >= 0")
        return budget

    def digest(self) -> str:
        return digest({k: v for k, v in asdict(self).items() if v is not None})


@dataclass
class CallRecord:
    """One settled call as a receipt lists it (content-blind: no prompts, no answers)."""

    call_id: str
    path: str
    kind: str
    provider: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    estimated_usd: float | None
    attempt: int
    replayed: bool = False

    @property
    def priced(self) -> bool:
        return self.estimated_usd is not None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class ResumeInfo:
    attempts: int
    prior_calls: int
    prior_estimated_usd: float
    prior_tokens: int
    prior_unpriced: bool
    possible_double_count_calls: int
    discarded_partial_turn: bool
    prior_settled: dict | None = None  # present when the run carries a budget

    def to_dict(self) -> dict:
        data = asdict(self)
        if data["prior_settled"] is None:
            del data["prior_settled"]
        return data


@dataclass
class Receipt:
    """What the run spent: every settled call (all attempts), totals, and resume facts."""

    calls: list[CallRecord] = field(default_factory=list)
    resume: ResumeInfo | None = None
    label: str = PRICE_LABEL
    unjournaled: list[str] = field(default_factory=list)  # model requests sent unjournaled this attempt (paid again on resume)

    @property
    def tokens(self) -> int:
        return sum(c.total_tokens for c in self.calls)

    @property
    def estimated_usd(self) -> float:
        return round(sum(c.estimated_usd or 0.0 for c in self.calls), 10)

    @property
    def unpriced(self) -> bool:
        return any(not c.priced for c in self.calls)

    def summary(self) -> str:
        """One line: calls, tokens and inferred USD (with unpriced calls said, never counted as $0)."""
        unjournaled = f"; UNJOURNALED (paid again on resume): {', '.join(self.unjournaled)}" if self.unjournaled else ""
        return f"{calls_text(len(self.calls))}, {self.tokens} tokens, {self.usd_text()} ({self.label}){unjournaled}"

    def usd_text(self) -> str:
        """The total as people read it (``calls.pricing.usd_text``), unpriced calls said, never counted as $0."""
        return receipt_usd_text(self.estimated_usd, len(self.calls), sum(1 for c in self.calls if not c.priced))

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        rows = [(c.call_id, c.model, c.attempt, c.total_tokens, usd_text(c.estimated_usd))
                for c in self.calls[:50]]
        more = f" (the first 50 of {len(self.calls)})" if len(self.calls) > 50 else ""
        resume = f"; resume: {self.resume.to_dict()}" if self.resume else ""
        return bundle(f"Receipt: {self.summary()}{resume}",
                      table(("call", "model", "attempt", "tokens", "USD"), rows, caption=f"Receipt: {self.summary()}{more}"))

    def to_dict(self) -> dict:
        return {
            "calls": [{**asdict(c), "priced": c.priced} for c in self.calls],
            "tokens": self.tokens,
            "estimated_usd": self.estimated_usd,
            "unpriced": self.unpriced,
            "label": self.label,
            "resume": self.resume.to_dict() if self.resume else None,
            "unjournaled": list(self.unjournaled),
        }


def _bad(run_id: str, event: dict, problem: str) -> JournalCorruptionError:
    return JournalCorruptionError(
        f"journal of run {run_id!r}, event {event.get('seq')} ({event.get('type')}): {problem}; "
        "a journaled figure failed revalidation (tampered or corrupt): restore the journal from a backup",
        run_id=run_id, line=(event.get("seq") or 0) + 1,
    )


def _count(run_id: str, event: dict, call: dict, name: str) -> int:
    value = call.get(name, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _bad(run_id, event, f"{name}={value!r} is not a non-negative integer")
    return value


def record_from_event(run_id: str, event: dict, attempt: int) -> CallRecord:
    """Revalidate a ``call_settled`` event's figures (the meter's own checks) into a CallRecord."""
    call = event.get("call")
    if not isinstance(call, dict):
        raise _bad(run_id, event, "has no 'call' object")
    usage = call.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    prompt = _count(run_id, event, usage, "prompt_tokens")
    completion = _count(run_id, event, usage, "completion_tokens")
    cached = _count(run_id, event, usage, "cached_tokens")
    total = usage.get("total_tokens", prompt + completion)
    if total != prompt + completion:
        raise _bad(run_id, event, f"total_tokens={total!r} is not prompt_tokens + completion_tokens ({prompt + completion})")
    if cached > prompt:
        raise _bad(run_id, event, f"cached_tokens={cached} exceeds prompt_tokens={prompt}")
    usd = call.get("estimated_usd")
    model = call.get("model") or event.get("model") or ""
    price = call.get("price_per_million")
    if "price_per_million" in call:
        # Revalidate against the price recorded with the call, so a later price-table change
        # does not turn an honest journal into a "corrupt" one.
        if price is not None and not (isinstance(price, (list, tuple)) and len(price) == 2 and all(
                isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) and p >= 0 for p in price)):
            raise _bad(run_id, event, f"price_per_million={price!r} is not two finite amounts >= 0")
        expected = None if price is None else round((prompt * price[0] + completion * price[1]) / 1_000_000, 10)
    else:
        expected = estimate_usd(model, prompt, completion)
    if usd is None:
        if expected is not None:
            raise _bad(run_id, event, f"estimated_usd is missing for priced model {model!r}")
    else:
        if not isinstance(usd, (int, float)) or isinstance(usd, bool) or not math.isfinite(usd) or usd < 0:
            raise _bad(run_id, event, f"estimated_usd={usd!r} is not a finite amount >= 0")
        if expected is None and "price_per_million" in call:
            raise _bad(run_id, event, f"estimated_usd={usd!r} given for a call recorded as unpriced")
        if expected is not None and abs(expected - usd) > 1e-9:
            raise _bad(run_id, event, f"estimated_usd={usd!r} does not match the list price of {model!r} ({expected!r})")
    return CallRecord(str(call.get("call_id", "")), str(event.get("path", "")), str(event.get("kind", "model")),
                      str(call.get("provider", event.get("provider", ""))), model, prompt, completion, cached,
                      float(usd) if usd is not None else None, attempt)


class Ledger:
    """Meter, receipt and replay window of one run attempt."""

    def __init__(self, run_id: str, events: Sequence[dict], attempt: int | None = None, *,
                 segments: Segments | None = None) -> None:
        """``attempt`` None: the one after the journal's last (``segments``, if given, is fed the journal:
        a writer opening a run keeps it, so the journal is walked once)."""
        self.run_id = run_id
        self.budget: Budget | None = None
        self.records: list[CallRecord] = []
        self._replay: dict[tuple, deque[dict]] = defaultdict(deque)
        self._settled_ids: set[str] = set()
        self.unsettled_intents: dict[str, dict] = {}
        self.resume: ResumeInfo | None = None
        self.unjournaled: list[str] = []  # model requests the transport journal saw but could not journal
        self.in_flight: dict[str, tuple[float, int]] = {}  # call id -> (worst USD, worst tokens) of calls under way
        started: dict[str | None, dict] = {}  # keyed as the journal gives them: a damaged event may lack its call_id
        window_start = 0  # index of the first event after the last boundary
        segments = Segments() if segments is None else segments
        self._settlements: dict[str | None, dict] = {}
        self.calls_started = 0
        for index, event in enumerate(events):
            etype = event["type"]
            if etype in SEGMENT_EVENTS:  # the others leave it as it was: no call for each journaled call
                segments.feed(event)
            if etype == "tool_intent":
                self.unsettled_intents[event["call_id"]] = event
                self.calls_started += 1
            elif etype == "tool_settled":
                call_id = event.get("call_id")
                if call_id is not None:  # intents are keyed by the str call_id journaled_call wrote
                    self.unsettled_intents.pop(call_id, None)
                self._settlements[call_id] = event
            elif etype == "call_started":
                started[event["call_id"]] = event
                self.calls_started += 1
            elif etype == "call_settled":
                started.pop((event.get("call") or {}).get("call_id"), None)
                self.records.append(record_from_event(run_id, event, segments.number))
            elif etype == "call_failed":
                started.pop(event.get("call_id"), None)
            elif etype in BOUNDARIES:
                window_start = index + 1
        self.attempt = attempt = segments.number + 1 if attempt is None else attempt
        window = [e for e in events[window_start:] if e["type"] in CALL_EVENTS]
        for event in window:
            if event["type"] == "call_settled":
                self._replay[("model", event.get("path"), event["call"].get("request_sha256"))].append(event)
            elif event["type"] == "tool_intent":
                self._replay[("tool", event.get("path"), event.get("tool"))].append(event)
        for key, queue in self._replay.items():  # identical requests replay in the order they were made,
            if key[0] == "model" and len(queue) > 1:  # not the order they settled (concurrent calls)
                self._replay[key] = deque(sorted(queue, key=_call_ordinal))
        if attempt > 1:
            prior = list(self.records)
            self.resume = ResumeInfo(
                attempts=attempt,
                prior_calls=len(prior),
                prior_estimated_usd=round(sum(r.estimated_usd or 0.0 for r in prior), 10),
                prior_tokens=sum(r.total_tokens for r in prior),
                prior_unpriced=any(not r.priced for r in prior),
                possible_double_count_calls=len(started),
                discarded_partial_turn=any(e["type"] in ("call_settled", "tool_settled") for e in window),
            )

    # ---- spend ---------------------------------------------------------------------------
    def set_budget(self, budget: Budget | None) -> None:
        self.budget = budget
        if budget is not None and self.resume is not None:
            self.resume.prior_settled = {"usd": self.resume.prior_estimated_usd, "tokens": self.resume.prior_tokens,
                                         "calls": self.resume.prior_calls}

    def spent(self) -> tuple[float, int, int]:
        """Settled spend, plus the worst case of the calls in flight (concurrent calls share one budget)."""
        return (sum(r.estimated_usd or 0.0 for r in self.records) + sum(u for u, _ in self.in_flight.values()),
                sum(r.total_tokens for r in self.records) + sum(t for _, t in self.in_flight.values()),
                len(self.records) + len(self.in_flight))

    def check_budget(self, model: str, estimated_prompt_tokens: int, max_tokens: int | None) -> None:
        """Refuse a call that would exceed the budget, before it is sent (prior attempts' spend counts)."""
        if self.budget is None:
            return
        usd, tokens, calls = self.spent()
        worst_tokens = estimated_prompt_tokens + (max_tokens or 0)
        problems = []
        if self.budget.calls is not None and calls + 1 > self.budget.calls:
            problems.append(f"calls: {calls} made, budget {self.budget.calls}")
        if self.budget.tokens is not None and tokens + worst_tokens > self.budget.tokens:
            problems.append(f"tokens: {tokens} used + ~{worst_tokens} for this call > budget {self.budget.tokens}")
        if self.budget.usd is not None:
            cost = estimate_usd(model, estimated_prompt_tokens, max_tokens or 0)
            if cost is None:
                problems.append(f"usd: model {model!r} has no list price, so a USD budget cannot be enforced "
                                "(caravanserai.pricing.register_price it, or budget by tokens/calls)")
            elif usd + cost > self.budget.usd:
                problems.append(f"usd: {usd:.6f} spent + ~{cost:.6f} for this call > budget {self.budget.usd}")
        if problems:
            raise BudgetExceeded(
                f"run {self.run_id!r}: the next call would exceed its budget ({'; '.join(problems)}); it was not sent. "
                "Raise the budget under a new run id, or stop here",
                run_id=self.run_id, problems=problems,
            )

    def reserve(self, call_id: str, model: str, estimated_prompt_tokens: int, max_tokens: int | None) -> None:
        """A call checked against the budget is in flight: its worst case counts until it settles or fails."""
        if self.budget is not None:
            worst = estimated_prompt_tokens + (max_tokens or 0)
            self.in_flight[call_id] = (estimate_usd(model, estimated_prompt_tokens, max_tokens or 0) or 0.0, worst)

    def release(self, call_id: str) -> None:
        self.in_flight.pop(call_id, None)

    def settle(self, event: dict, replayed: bool = False) -> CallRecord:
        self.release(str((event.get("call") or {}).get("call_id", "")))
        record = record_from_event(self.run_id, event, self.attempt)
        record.replayed = replayed
        if not replayed:
            self.records.append(record)
        return record

    def settle_fresh(self, record: CallRecord) -> None:
        """A call this process just settled, with figures it computed itself (no revalidation needed)."""
        self.release(record.call_id)
        self.records.append(record)

    def receipt(self) -> Receipt:
        return Receipt(list(self.records), self.resume, unjournaled=list(self.unjournaled))


    # ---- replay --------------------------------------------------------------------------
    def replay_model(self, path: str, request_sha: str) -> dict | None:
        queue = self._replay.get(("model", path, request_sha))
        return queue.popleft() if queue else None

    def replay_tool(self, path: str, tool: str, args: dict) -> tuple[dict, dict | None] | None:
        """(intent, settlement or None) of the next journaled call of this tool with these arguments.

        Resumed code calls in journal order, so the head of the tool's queue almost always
        matches: compare the arguments directly, and fall back to their digest (tuples and
        other values JSON turns into lists) before scanning the rest of the queue.
        """
        queue = self._replay.get(("tool", path, tool))
        if not queue:
            return None
        head = queue[0]
        if head.get("args") == args:
            queue.popleft()
        else:
            wanted = digest(args)
            match = next((i for i, intent in enumerate(queue) if intent.get("args_sha256") == wanted), None)
            if match is None:
                return None
            head = queue[match]
            del queue[match]
        return head, self._settlements.get(head["call_id"])

    def next_call_id(self, path: str) -> str:
        """A call id unique in the run and stable in its journal: ``<path>#<ordinal>``."""
        self.calls_started += 1
        return f"{path}#{self.calls_started}"

    def boundary(self) -> None:
        """A new waypoint/turn was committed: what the old window held is no longer replayable."""
        self._replay.clear()


def _call_ordinal(settled: dict) -> int:
    """The ordinal ``next_call_id`` gave a call (``<path>#<n>``): the order calls were started."""
    tail = str((settled.get("call") or {}).get("call_id", "")).rpartition("#")[2]
    return int(tail) if tail.isdigit() else 0


def completed_receipt(run_id: str, events: Sequence[dict]) -> Receipt:
    """The receipt a completed run returned: its calls, and the resume facts of the attempt that completed it."""
    done = next((i for i, e in enumerate(events) if e["type"] == "run_completed"), len(events) - 1)
    segments = Segments()
    starts = [i for i, e in enumerate(events[: done + 1]) if segments.feed(e) == "attempt"]
    begin, attempts = (starts[-1], len(starts)) if starts else (0, 1)
    calls = Ledger(run_id, events[: done + 1], attempts).records
    return Receipt(calls, Ledger(run_id, events[:begin], attempts).resume)
