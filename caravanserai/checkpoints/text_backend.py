"""The ``text`` DurableAgent backend: deterministic, offline, readable English, no model weights.

Choose it with ``DurableAgent().begin(prompts, model_id="text")``. Each step's output is a short
note (about 25-50 words, a few sentences) composed from the step's prompt, a word of the previous
step's output and a small vocabulary, every choice read from a digest of the step's KV cache. So
it is a pure function of the prompt and the previous output: the same run gives the same text in
any process, and a fork that edits step k changes step k's text and, through each previous
output, the steps after it. It stands in for a model where a person reads the outputs (the
README, the docs, notebook 04 without torch) and keeps everything else as the ``fake`` backend
does: words and punctuation are the tokens, each context token gets one KV entry of
``FakeBackend.ENTRY_BYTES`` (derived from the token and its position), so checkpoints, deltas,
forks, ``tokens_computed`` and the token counts of ``timelines`` work the same.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from .fake_backend import FakeBackend

__all__ = ["TextBackend", "compose", "previous_text"]

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_WORD = re.compile(r"[A-Z]{2,}\b|[A-Za-z][A-Za-z'-]{2,}")
MAX_TASK_WORDS = 16  # a long prompt is quoted up to this many words, so a note stays short

_STOP = frozenset("""the and for but not you are was its our all any can has had one two how why who out off yet
about after again also before being could first from have into just like make more most much must next only
other over same should some such than that their them then there these they this those very what when where
which while will with would your instead""".split())

_OPENERS = ('Working on "{task}".', "Step goal: {task}.", 'I take up "{task}".', "Now: {task}.")
_FIRST = ("This is the first step, so I start from scratch.", "Nothing came before, so I begin with a clean slate.",
          "No earlier notes exist yet, so I look around first.")
_CARRY = ("After the last note on {thing}, I keep going.", "The last step was about {thing}; I keep it in view.",
          "I pick up where the last step left off: {thing}.")
_SUBJECTS = ("The log", "The stack trace", "A quick test", "The config", "The reporter's note", "The diff",
             "The error message", "A second look")
_VERBS = ("shows", "suggests", "points to", "confirms", "hints at", "rules out")
_FINDINGS = ("a race in the cache", "an off-by-one in the parser", "a missing null check", "a stale lock file",
             "a timeout under load", "a typo in the settings", "a wrong default", "an unhandled empty list",
             "a retry that never stops", "a bad date format")
_FOCUS = ('I keep "{focus}" in mind for what comes next.', 'That changes how I read "{focus}".',
          'I write it down next to "{focus}".')
_RESULTS = ("done, with notes for the next step", "done, one question left open", "done after a second try",
            "done; the evidence is saved", "done, and quicker than expected", "partly done; the rest is clear",
            "done, with a small caveat", "done and double-checked")


def previous_text(previous: Any) -> str:
    """The previous step's output as text: a str as is, nothing for a missing one, any other JSON value as JSON
    (a fork may set a step's output to a number or a list)."""
    if previous is None:
        return ""
    if isinstance(previous, str):
        return previous
    return json.dumps(previous, ensure_ascii=False, sort_keys=True, default=repr)


def compose(prompt: str, previous: str, seed: bytes) -> str:
    """A short readable note for ``prompt`` after ``previous``, every choice read from ``seed`` (32 bytes)."""
    def pick(options: tuple[str, ...], k: int) -> str:
        return options[int.from_bytes(seed[2 * k:2 * k + 2], "big") % len(options)]

    words = prompt.split()
    task = " ".join(words[:MAX_TASK_WORDS]).rstrip(".!?;:,") + (" (and more)" if len(words) > MAX_TASK_WORDS else "")
    sentences = [pick(_OPENERS, 0).format(task=task or "carry on")]
    thing = _carried(previous, seed)
    if thing:
        sentences.append(pick(_CARRY, 1).format(thing=thing))
    else:
        sentences.append("I read what the last step gave first." if previous.strip() else pick(_FIRST, 1))
    sentences.append(f"{pick(_SUBJECTS, 2)} {pick(_VERBS, 3)} {pick(_FINDINGS, 4)}.")
    focus = _content_words(prompt)
    if focus:
        sentences.append(pick(_FOCUS, 5).format(focus=focus[-1]))
    sentences.append(f"Result: {pick(_RESULTS, 6)}.")
    return " ".join(sentences)


def _carried(previous: str, seed: bytes) -> str:
    """What a step takes up from the previous output: its finding ("the stale lock file"), else one of
    its words, quoted; nothing when there is no previous output."""
    found = max(_FINDINGS, key=previous.rfind)  # the finding the previous note ends on
    if found in previous:
        return "the " + found.split(" ", 1)[1]
    words = _content_words(previous)
    return f'"{words[int.from_bytes(seed[20:22], "big") % len(words)]}"' if words else ""


def _content_words(text: str) -> list[str]:
    """The words of ``text`` worth quoting back (three letters or more, not a stop word; acronyms such as PR),
    lower-cased unless all capitals, in order."""
    words = (w if w.isupper() else w.lower() for w in _WORD.findall(text))
    return [w for w in words if w.lower() not in _STOP]


class TextBackend(FakeBackend):
    """Deterministic readable text with a per-token KV cache (see the module docstring)."""

    name = "text"

    def __init__(self, model_id: str = "text") -> None:
        super().__init__(model_id)

    @staticmethod
    def words(text: str) -> list[str]:
        """Words and punctuation marks: the text backend's tokens."""
        return _TOKEN.findall(text)

    def generate(self, prompt: str, previous: Any) -> tuple[str, bytes]:
        earlier = previous_text(previous)
        context = self.words(prompt) + self.words(earlier)
        kv = b"".join(self.kv_entry(t, i) for i, t in enumerate(context))
        text = compose(prompt, earlier, hashlib.sha256(kv).digest())
        kv += b"".join(self.kv_entry(t, len(context) + k) for k, t in enumerate(self.words(text)))
        return text, kv
