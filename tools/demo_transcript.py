"""`make demo`: the README transcript, with Ctrl-C sent when the demo prints its step-3 line.

    $ python demo.py            [1/5] [2/5] [3/5], then ^C (SIGINT as soon as "[3/5]" is printed)
    $ python demo.py            resumes: [4/5] [5/5] done.
    $ caravanserai show demo    the last waypoint

The interrupt follows the demo's own output, not a timer, so it lands in step 4 however slowly the
machine starts Python (step 4 is still sleeping then: CARAVANSERAI_DEMO_DELAY, 1 s by default). An
earlier demo run in this directory is deleted first. Exits non-zero, saying why, if the transcript
does not go as described.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import caravanserai

DEMO = Path(__file__).resolve().parent.parent / "demo.py"
STOP_AFTER = "[3/5]"


def say(command: str, *, first: bool = False) -> None:
    if not first:
        print()
    print(f"$ {command}", flush=True)


def first_run() -> int:
    """``python demo.py``, interrupted (SIGINT, as Ctrl-C) right after it prints step 3; its exit status."""
    say("python demo.py", first=True)
    proc = subprocess.Popen([sys.executable, str(DEMO)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    assert proc.stdout is not None
    interrupted = False
    try:
        for line in proc.stdout:
            print(line, end="", flush=True)
            if not interrupted and line.startswith(STOP_AFTER):
                proc.send_signal(signal.SIGINT)
                print("^C", end="", flush=True)  # what a terminal shows for Ctrl-C
                interrupted = True
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> int:
    try:
        caravanserai.clean("demo")  # start from step 1 (False when there was nothing to delete)
    except caravanserai.CaravanseraiError as error:  # RunLocked: a demo is running in this directory now
        print(f"make demo: {error}", file=sys.stderr)
        return 1
    status = first_run()
    if status != 130:
        print(f"\nmake demo: the first run should have been interrupted after {STOP_AFTER} (exit status 130); "
              f"it exited with {status}", file=sys.stderr)
        return 1
    say("python demo.py")
    if subprocess.run([sys.executable, str(DEMO)]).returncode != 0:
        return 1
    say("caravanserai show demo")
    return subprocess.run([sys.executable, "-m", "caravanserai", "show", "demo"]).returncode


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C at the keyboard: stop quietly
        sys.exit(130)
