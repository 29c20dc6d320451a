"""A tight loop of journaled ``read`` tool calls in one durable run (tests/test_call_path.py).

    python tool_loop.py STORE RUN_ID N

Prints ``EXEC i`` when the tool body really runs and ``ACK i`` once ``call_tool`` returned for
call ``i`` (its result is then durable), then ``DONE`` after the run completed. The parent
SIGKILLs it at random instants and resumes the same run id.
"""

from __future__ import annotations

import sys

import caravanserai


def step(i: int) -> dict:
    print(f"EXEC {i}", flush=True)
    return {"i": i, "text": f"step {i:05d} " + "." * 32}


def main() -> None:
    store, run_id, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with caravanserai.durable(run_id, store=store) as run:
        for i in range(n):
            result = run.call_tool(step, {"i": i}, name="step", effect="read")
            assert result == {"i": i, "text": f"step {i:05d} " + "." * 32}, result
            print(f"ACK {i}", flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
