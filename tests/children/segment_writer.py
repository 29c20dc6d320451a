"""Child for tests/test_takeover.py: append to an object-storage run, a segment every 6 chunks and a
delta every 2, and SIGKILL itself at one point of the compaction.

    python segment_writer.py STORE_URL RUN_ID COUNT WHEN KIND NTH
Prints the seq of each acknowledged event (after ``append`` returned), then "RELEASED". WHEN is
``before``/``after``, KIND the request to kill at (``segment``, ``delta`` or ``head`` put, the
``delete`` of the segment and deltas a new segment replaced, ``chunk`` put, the ``release`` of the
lease object) and NTH which one of that kind (1-based);
``none`` as KIND runs to the end.
"""

import os
import signal
import sys
from collections import Counter

from caravanserai import journal, open_store

url, run_id, count, when, kind, nth = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], \
    int(sys.argv[6])
store = open_store(url)
store.compact_every, store.delta_every = 6, 2
bucket = store.bucket
seen: Counter = Counter()


def kind_of(key: str, data: bytes | None) -> str:
    if key.endswith("/head"):
        return "head"
    if "/segments/" in key:
        return "delete" if data is None else "delta" if "-" in key.rsplit("/", 1)[1] else "segment"
    if "/leases/" in key:
        return "release" if data is not None and b'"expires_at": 0' in data else "lease"
    return "chunk" if "/journal/" in key else "other"


def checkpoint(key: str, data: bytes | None, moment: str) -> None:
    if moment == "before":
        seen[kind_of(key, data)] += 1
    if kind_of(key, data) == kind and seen[kind] == nth and when == moment:
        os.kill(os.getpid(), signal.SIGKILL)


real_put, real_delete, real_delete_many = bucket.put, bucket.delete, bucket.delete_many


def put(key, data, *, mode="overwrite"):
    checkpoint(key, data, "before")
    result = real_put(key, data, mode=mode)
    checkpoint(key, data, "after")
    return result


def delete(key):
    checkpoint(key, None, "before")
    result = real_delete(key)
    checkpoint(key, None, "after")
    return result


def delete_many(keys):  # one request, one "delete"
    if keys:
        checkpoint(keys[0], None, "before")
    real_delete_many(keys)
    if keys:
        checkpoint(keys[0], None, "after")


bucket.put, bucket.delete, bucket.delete_many = put, delete, delete_many
lease = store.acquire(run_id)
_, tail = journal.decode(run_id, store.load_held(lease))
for _ in range(count):
    lines, _, new_tail = journal.encode([{"type": "note", "i": tail.seq}], tail)
    store.append(run_id, lines, lease=lease, seq=tail.seq)
    print(tail.seq, flush=True)
    tail = new_tail
lease.release()
print("RELEASED", flush=True)
