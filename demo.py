"""The caravanserai demo: five steps of "work", checkpointed; Ctrl-C it and run it again.

    python demo.py            # ^C partway through, then:
    python demo.py            # picks up where it left off
    caravanserai show demo

CARAVANSERAI_DEMO_DELAY sets the seconds per step (default 1).
"""

import os
import signal
import sys
import time

from caravanserai import checkpoint, resumable

TOTAL = 5
DELAY = float(os.environ.get("CARAVANSERAI_DEMO_DELAY", "1"))


@resumable
def do_the_task(run_id, state):
    step = state.get("step", 0)
    while step < TOTAL:
        step += 1
        time.sleep(DELAY)  # the "work" of this step
        checkpoint(run_id, {"step": step}, f"finished step {step}/{TOTAL}")
        print(f"[{step}/{TOTAL}] doing work...", flush=True)  # shown once the step is safe


if __name__ == "__main__":
    try:
        do_the_task("demo", {"step": 0})
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not garble the message
        print("\ncrashed/killed mid-task. run me again - I'll resume, not restart.", flush=True)
        sys.exit(130)
    print("done.")
