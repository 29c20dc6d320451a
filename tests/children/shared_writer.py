"""Child for tests/test_takeover.py: checkpoint a counter into a shared store until stopped.

    python shared_writer.py STORE_URL RUN_ID LIMIT DELAY
Prints each acknowledged step; on LeaseLost prints "LEASE LOST" and exits 3.
"""

import sys
import time

import caravanserai

url, run_id, limit, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
saved = caravanserai.load_latest(run_id, store=url)
step = saved[0]["step"] if saved else 0
try:
    while step < limit:
        step += 1
        caravanserai.checkpoint(run_id, {"step": step, "by": sys.argv[5] if len(sys.argv) > 5 else "writer"},
                                f"step {step}", store=url)
        print(step, flush=True)
        time.sleep(delay)
except caravanserai.LeaseLost as exc:
    print("LEASE LOST", exc, flush=True)
    sys.exit(3)
except caravanserai.RunLocked as exc:
    print("LOCKED", exc, flush=True)
    sys.exit(4)
print("DONE", flush=True)
