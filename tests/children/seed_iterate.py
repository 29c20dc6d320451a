"""Child for tests/test_kill.py: the seed README's resumable_iterate sample, verbatim below the line.

Only ``all_files()`` and ``convert_file(f)`` are defined above it: each conversion appends the
file name to ``converted.log`` (flush + fsync), then sleeps ``SEED_ITEM_DELAY`` seconds so a
SIGKILL can land in the middle of an item.
"""

import os
import time

_DELAY = float(os.environ.get("SEED_ITEM_DELAY", "0.1"))


def all_files():
    return [f"file-{i:02d}.txt" for i in range(1, 13)]


def convert_file(f):
    with open("converted.log", "a", encoding="utf-8") as log:
        log.write(f + "\n")
        log.flush()
        os.fsync(log.fileno())
    time.sleep(_DELAY)


# ---- the seed README sample, verbatim -------------------------------------------------------
from caravanserai import resumable_iterate

for f in resumable_iterate(all_files(), run_id="my-run"):
    convert_file(f)
