"""Ordinary notebook values survive a SIGKILLed kernel, with no trust configured and no pickle.

A REAL ipykernel runs a ``%%resumable`` loop that fills an int-keyed dict, a set, a tuple-keyed
dict, keeps a datetime and the OpenAI ``ChatCompletion`` objects the local model server returned
(through a ``durable_client`` behind a CountingProxy), and holds a generator. The kernel is
SIGKILLed after two loop commits, restarted, and the cells re-run: every value is back with its
type, the generator is named on the status line as not saved, nothing was pickled, and no settled
model request was sent again. Skips locally without the model server; fails under CI=true.
"""

from __future__ import annotations

import json

from kernel_helpers import events, topic_of, wait_for_waypoints

TOPICS = ["rivers", "mountains", "deserts", "forests"]

SETUP = """\
import datetime, json, time
import openai
import caravanserai
from caravanserai import resumable_iterate
client = caravanserai.durable_client(openai.OpenAI(base_url={base!r}, api_key="x", max_retries=0))
MODEL, TOPICS = {model!r}, {topics!r}
"""

CELL = """\
%%resumable ordinary-values
results = {}
seen = set()
pairs = {}
started = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.timezone.utc)
replies = {}
numbers = (i * i for i in range(100))
for x in resumable_iterate(range(len(TOPICS))):
    results[x] = x * 10
    seen.add(x)
    pairs[(x, x + 1)] = f"pair {x}"
    replies[x] = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=4,
        messages=[{"role": "user", "content": f"Name one fact about {TOPICS[x]}."}])
    time.sleep(0.2)
print("done", len(results))
"""

CHECK = """\
print(json.dumps({
    "results": sorted(results.items()), "result_keys": sorted({type(k).__name__ for k in results}),
    "seen": sorted(seen), "seen_type": type(seen).__name__,
    "pairs": sorted([list(k), v] for k, v in pairs.items()), "pair_keys": sorted({type(k).__name__ for k in pairs}),
    "started": started.isoformat(), "started_type": type(started).__name__,
    "replies": sorted(replies), "reply_types": sorted({type(r).__name__ for r in replies.values()}),
    "texts": [replies[x].choices[0].message.content for x in sorted(replies)],
}))
"""


def test_ordinary_values_come_back_after_sigkill_without_trust(tmp_path, kernel, model_server, proxy):
    k = kernel()
    k.ok("%load_ext caravanserai")
    k.ok(SETUP.format(base=proxy.url + "/v1", model=model_server.model, topics=TOPICS))
    k.submit(CELL)
    wait_for_waypoints(tmp_path, "ordinary-values", 2)
    k.kill_and_restart()
    sent_at_kill = [topic_of(b) for b in proxy.posts("/chat/completions")]
    before = events(tmp_path, "ordinary-values")
    settled = sum(e["type"] == "call_settled" for e in before)

    k.ok("%load_ext caravanserai")
    k.ok(SETUP.format(base=proxy.url + "/v1", model=model_server.model, topics=TOPICS))
    got = k.ok(CELL)
    assert "done 4" in got.stdout
    assert any("resumed" in text and "results" in text for text in got.displays), got.displays
    assert any("not saved: numbers (generator)" in text for text in got.displays), got.displays
    values = json.loads(k.ok(CHECK).stdout)
    assert values["results"] == [[x, x * 10] for x in range(4)] and values["result_keys"] == ["int"]
    assert values["seen"] == [0, 1, 2, 3] and values["seen_type"] == "set"
    assert values["pairs"] == [[[x, x + 1], f"pair {x}"] for x in range(4)] and values["pair_keys"] == ["tuple"]
    assert values["started"] == "2026-11-30T12:00:00+00:00" and values["started_type"] == "datetime"
    assert values["replies"] == [0, 1, 2, 3] and values["reply_types"] == ["ChatCompletion"]
    assert all(isinstance(t, str) and t for t in values["texts"])

    after = [topic_of(b) for b in proxy.posts("/chat/completions")][len(sent_at_kill):]
    assert after == TOPICS[settled:], (sent_at_kill, after)  # settled calls replayed from the journal, not re-sent
    codecs = {entry["codec"] for e in events(tmp_path, "ordinary-values") if "names" in e
              for entry in e["names"]["values"].values()}
    assert codecs <= {"json", "typed"}, codecs  # nothing fell back to pickle
