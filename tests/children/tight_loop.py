"""Child for tests/test_kill.py: checkpoint in a tight loop, acknowledging each returned number.

usage: tight_loop.py RUN_ID ACK_FD [LIMIT]

Resumes the run (step = last saved step + 1) and loops
``n = checkpoint(run_id, {"step": i, "pad": pad(i)}, f"note {i}")``; after each call returns it
writes ``"<n>\\n"`` to the file descriptor ACK_FD (a pipe the parent reads). The parent SIGKILLs
it at a random instant. With LIMIT it stops after LIMIT checkpoints and exits normally.
"""

import os
import sys

from caravanserai import checkpoint, load_latest


def pad(i: int) -> str:
    """Deterministic filler of varying size (0 B .. ~12 KiB), so kills also land inside big writes."""
    r = (i * 7919) % 61
    size = r * r * 4 if r % 8 == 0 else r * 8  # mostly under 500 B, one in ~8 up to 12 KiB
    unit = f"{i}:caravan-ø-日本|"
    return (unit * (size // len(unit) + 1))[:size]


def main() -> None:
    run_id, ack_fd = sys.argv[1], int(sys.argv[2])
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else None
    saved = load_latest(run_id)
    i = saved[0]["step"] + 1 if saved is not None else 1
    done = 0
    while limit is None or done < limit:
        n = checkpoint(run_id, {"step": i, "pad": pad(i)}, f"note {i}")
        os.write(ack_fd, f"{n}\n".encode())
        i += 1
        done += 1


if __name__ == "__main__":
    main()
