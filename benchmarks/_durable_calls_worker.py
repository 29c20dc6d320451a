"""Worker for ``bench_durable_calls.py``: one scenario of one implementation per process.

    python _durable_calls_worker.py --impl {floor,ours,langgraph,dbos} --scenario SCENARIO --dir WORKDIR [...]

Scenarios (the same shape for every implementation):

- ``floor``: write + fdatasync of a 100 B record appended to a file (implementation ``floor``).
- ``overhead``: one run / entrypoint / workflow of ``--n`` journaled calls of a trivial function
  that returns ~80 B, after an untimed warm-up run of 20 calls; the process measures the fsync
  floor (50 samples) on the same disk just before and just after the run, reported as
  ``floor_before_us``, ``floor_after_us`` and ``floor_here_us`` (the median of all 100).
- ``resume_write``: one run of ``--big`` journaled calls, then ``os._exit(137)`` before it ends.
- ``resume``: a fresh process finishes that killed run; it counts the calls it re-executed.
- ``rerun_setup`` / ``rerun``: finish a small run (model call, tool call, model call), then, in a
  fresh process, run the same id again ``--reps`` times and count what was executed.

``ours`` runs under the repo's interpreter with the repo on ``PYTHONPATH``; ``langgraph`` and
``dbos`` under ``benchmarks/.venv-peers`` with ``-I``. Imports happen before the timed work and
are reported as ``import_s``. The result is one line ``RESULT {json}`` on stdout (the writer
prints it before it kills itself).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

T_PROCESS = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, also under python -I
from _common import (  # noqa: E402
    Usage,
    best_of,
    dbos_destroy,
    dbos_launch,
    describe,
    emit_result,
    fsync_floor,
    install_fsync_counter,
    nearest_rank,
    profile_text,
    which_caravanserai,
)

FSYNC = install_fsync_counter()  # before any implementation is imported; Python-level calls only
EXECUTED = {"n": 0}  # how many times a journaled function body really ran in this process
RERUN_INPUT = "How big is Samarkand?"
APP_VERSION = "bench-durable-calls"


def payload(i: int) -> dict:
    """~80 B as compact JSON: {"i":123,"text":"step 00123 ................................................"}."""
    return {"i": i, "text": f"step {i:05d} " + "." * 48}


# The journaled bodies, the same for every implementation (each framework wraps them its own way).
def step(i: int) -> dict:
    EXECUTED["n"] += 1
    return payload(i)


def model_call(messages: list) -> dict:
    EXECUTED["n"] += 1
    return {"role": "assistant", "content": "", "tool_calls": [{"name": "lookup", "arguments": {"city": "Samarkand"}}]}


def lookup(city: str) -> dict:
    EXECUTED["n"] += 1
    return {"city": city, "population": 500_000}


def final_call(messages: list) -> dict:
    EXECUTED["n"] += 1
    return {"role": "assistant", "content": "Samarkand has about 500,000 people."}


def small_flow(question: str, calls: tuple, wait=lambda value: value) -> str:
    """The small finished run: model call, tool call, model call (``calls`` wrapped by the peer)."""
    model, tool, final = calls
    messages = [{"role": "user", "content": question}]
    first = wait(model(messages))
    found = wait(tool("Samarkand"))
    return wait(final(messages + [first, {"role": "tool", "content": json.dumps(found)}]))["content"]


def overhead_result(n: int, usage: Usage, loop_s: float, **extra) -> dict:
    """Scenario 1's answer: whole run and loop time, CPU, a plain loop of the same calls (min of 5, us)."""
    def plain() -> None:
        for i in range(n):
            payload(i)
    return {"n": n, "total_s": usage.wall, "loop_s": loop_s, "cpu_s": usage.cpu, "user_s": usage.user,
            "sys_s": usage.sys, "plain_loop_us": best_of(plain) * 1e6, "executed": EXECUTED["n"], **extra}


def rerun_result(times: list[float], **extra) -> dict:
    warm = sorted(times[1:])
    return {"first_s": times[0], "warm_median_s": statistics.median(warm) if warm else None,
            "warm_p90_s": nearest_rank(warm, 0.9) if warm else None, "reps": len(times), **extra}


# ================================================================================================
# ours
# ================================================================================================
def ours_imports(args: argparse.Namespace) -> dict:
    found = which_caravanserai(args.repo)
    import caravanserai.testing  # noqa: F401

    return found


def ours_overhead(args: argparse.Namespace) -> dict:
    import caravanserai

    store = os.path.join(args.dir, "ours-store")
    with caravanserai.durable(f"warm-{args.round}", store=store) as run:  # untimed warm-up
        for i in range(20):
            run.call_tool(step, {"i": i}, name="step", effect="read")
    EXECUTED["n"] = 0
    FSYNC.reset()
    with Usage() as usage:
        t0 = time.perf_counter()
        with caravanserai.durable(f"ovh-{args.round}", store=store) as run:
            t1, ru1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            for i in range(args.n):
                run.call_tool(step, {"i": i}, name="step", effect="read")
            loop_s, ru2 = time.perf_counter() - t1, resource.getrusage(resource.RUSAGE_SELF)
        t3 = time.perf_counter()
    assert EXECUTED["n"] == args.n, EXECUTED
    fsyncs, fsync_wait_s = FSYNC.calls, FSYNC.seconds
    # The same loop again with fdatasync counted but not made (not durable, untimed above): the library's
    # CPU when nothing blocks, against the loop above, where each call waits for the disk once.
    FSYNC.stubbed = True
    try:
        with caravanserai.durable(f"nosync-{args.round}", store=store) as run:
            ru3 = resource.getrusage(resource.RUSAGE_SELF)
            for i in range(args.n):
                run.call_tool(step, {"i": i}, name="step", effect="read")
            ru4 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        FSYNC.stubbed = False
    # The run's open and its end (complete, release, the run index) once per run, apart from the loop's calls.
    return overhead_result(args.n, usage, loop_s, fsyncs=fsyncs, fsyncs_per_call=fsyncs / args.n,
                           fsync_wait_s=fsync_wait_s,
                           open_s=t1 - t0, close_s=t3 - t1 - loop_s, loop_user_s=ru2.ru_utime - ru1.ru_utime,
                           loop_sys_s=ru2.ru_stime - ru1.ru_stime, loop_user_nosync_s=ru4.ru_utime - ru3.ru_utime)


def ours_resume_write(args: argparse.Namespace) -> None:
    import caravanserai

    t0 = time.perf_counter()
    with caravanserai.durable(args.id, store=os.path.join(args.dir, "ours-store")) as run:
        for i in range(args.big):
            run.call_tool(step, {"i": i}, name="step")
        emit_result({"calls": EXECUTED["n"], "write_s": time.perf_counter() - t0, "fsyncs": FSYNC.calls})
        os._exit(137)  # killed before the run finishes: no run_completed, no lease release


def ours_resume(args: argparse.Namespace) -> dict:
    import caravanserai

    store = os.path.join(args.dir, "ours-store")
    t0 = time.perf_counter()
    with caravanserai.durable(args.id, store=store) as run:
        t1 = time.perf_counter()
        for i in range(args.big):
            run.call_tool(step, {"i": i}, name="step")
        t2 = time.perf_counter()
    t3 = time.perf_counter()
    journal_path = os.path.join(store, args.id, "journal.jsonl")
    return {"total_s": t3 - t0, "open_s": t1 - t0, "replay_loop_s": t2 - t1, "close_s": t3 - t2,
            "re_executed": EXECUTED["n"], "attempt": run.attempt, "completed": run.completed,
            "journal_bytes": os.path.getsize(journal_path), **parse_floor(journal_path)}


def parse_floor(path: str) -> dict:
    """What reading the journal costs before any library code: read it, split its lines, parse each with
    orjson and keep it, with each line's SHA-256 (the hash chain); best of 3, untimed by the resume above.
    Kept, as a resume needs them: parsing and dropping each line reuses the same memory and costs about
    half as much here."""
    import hashlib

    import orjson

    def once() -> list:
        with open(path, "rb") as handle:
            lines = handle.read().split(b"\n")[:-1]
        return [(orjson.loads(line), hashlib.sha256(line).hexdigest()) for line in lines]

    times, count = [], 0
    for _ in range(3):
        t = time.perf_counter()
        kept = once()
        times.append(time.perf_counter() - t)
        count = len(kept)
        del kept
    return {"parse_floor_s": min(times), "journal_lines": count}


def ours_rerun_once(args: argparse.Namespace) -> tuple[float, object, object]:
    """One ``caravanserai.run`` of the small agent (a fresh ScriptedModel: any request would show)."""
    import caravanserai
    from caravanserai.testing import ScriptedModel

    model = ScriptedModel([ScriptedModel.tool("lookup", city="Samarkand"), "Samarkand has about 500,000 people."])
    agent = caravanserai.agent(id="bench-agent", instructions="Answer briefly.", model=model,
                               tools=[caravanserai.tool(lookup, effect="read")])
    t = time.perf_counter()
    result = caravanserai.run(agent, RERUN_INPUT, durable={"run_id": args.id, "store": os.path.join(args.dir, "ours-store")})
    return time.perf_counter() - t, model, result


def ours_rerun_setup(args: argparse.Namespace) -> dict:
    elapsed, model, result = ours_rerun_once(args)
    return {"first_run_s": elapsed, "model_requests": len(model.requests), "tool_calls": EXECUTED["n"],
            "text": result.text, "replayed": result.replayed}


def ours_rerun(args: argparse.Namespace) -> dict:
    runs = [ours_rerun_once(args) for _ in range(args.reps)]
    requests = sum(len(model.requests) for _, model, _ in runs)
    assert requests == 0, f"re-run called the model {requests} times"
    return rerun_result([t for t, _, _ in runs], model_requests=requests, tool_calls=EXECUTED["n"],
                        all_replayed=all(r.replayed for _, _, r in runs), texts=sorted({r.text for _, _, r in runs}))


# ================================================================================================
# LangGraph functional API + SqliteSaver, durability="sync"
# ================================================================================================
def lg_imports(args: argparse.Namespace) -> dict:
    import langgraph.checkpoint.sqlite  # noqa: F401
    import langgraph.func  # noqa: F401

    return {}


def lg_saver(path: str):
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    return conn, saver


def lg_steps(saver, die_after_loop: bool = False):
    """(entrypoint over n trivial tasks, dict that receives the in-loop time)."""
    from langgraph.func import entrypoint, task

    timing = {}
    step_task = task(step)

    @entrypoint(checkpointer=saver)
    def main(n: int) -> int:
        t = time.perf_counter()
        for i in range(n):
            step_task(i).result()
        timing["loop_s"] = time.perf_counter() - t
        if die_after_loop:
            emit_result({"calls": EXECUTED["n"], "loop_s": timing["loop_s"]})
            os._exit(137)
        return n

    return main, timing


def lg_cfg(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


def lg_overhead(args: argparse.Namespace) -> dict:
    conn, saver = lg_saver(os.path.join(args.dir, f"lg-ovh-{args.round}.sqlite"))
    main, timing = lg_steps(saver)
    main.invoke(20, lg_cfg(f"warm-{args.round}"), durability="sync")  # untimed warm-up
    EXECUTED["n"] = 0
    with Usage() as usage:
        out = main.invoke(args.n, lg_cfg(f"ovh-{args.round}"), durability="sync")
    assert out == args.n and EXECUTED["n"] == args.n, (out, EXECUTED)
    conn.close()
    return overhead_result(args.n, usage, timing["loop_s"])


def lg_resume_write(args: argparse.Namespace) -> None:
    conn, saver = lg_saver(os.path.join(args.dir, "lg-big.sqlite"))
    main, _ = lg_steps(saver, die_after_loop=True)
    main.invoke(args.big, lg_cfg(args.id), durability="sync")
    sys.exit("the LangGraph writer was expected to kill itself")


def lg_resume(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    conn, saver = lg_saver(os.path.join(args.dir, "lg-big.sqlite"))
    main, timing = lg_steps(saver)
    t1 = time.perf_counter()
    out = main.invoke(None, lg_cfg(args.id), durability="sync")  # resume the interrupted entrypoint
    t3 = time.perf_counter()
    pending = conn.execute("SELECT count(*) FROM writes WHERE thread_id = ?", (args.id,)).fetchone()[0]
    conn.close()
    return {"total_s": t3 - t0, "open_s": t1 - t0, "invoke_s": t3 - t1, "replay_loop_s": timing.get("loop_s"),
            "re_executed": EXECUTED["n"], "completed": out == args.big, "result": out, "writes_rows_after": pending}


def lg_small(saver):
    from langgraph.func import entrypoint, task

    calls = (task(model_call), task(lookup), task(final_call))

    @entrypoint(checkpointer=saver)
    def small(question: str) -> str:
        return small_flow(question, calls, wait=lambda future: future.result())

    return small


def lg_checkpoints(conn, thread: str) -> int:
    return conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = ?", (thread,)).fetchone()[0]


def lg_rerun_setup(args: argparse.Namespace) -> dict:
    conn, saver = lg_saver(os.path.join(args.dir, "lg-fin.sqlite"))
    t = time.perf_counter()
    text = lg_small(saver).invoke(RERUN_INPUT, lg_cfg(args.id), durability="sync")
    out = {"first_run_s": time.perf_counter() - t, "executed": EXECUTED["n"], "text": text,
           "checkpoints": lg_checkpoints(conn, args.id)}
    conn.close()
    return out


def lg_rerun(args: argparse.Namespace) -> dict:
    conn, saver = lg_saver(os.path.join(args.dir, "lg-fin.sqlite"))
    small = lg_small(saver)
    before = lg_checkpoints(conn, args.id)
    times, per_call, texts = [], [], set()
    for _ in range(args.reps):
        k = EXECUTED["n"]
        t = time.perf_counter()
        texts.add(small.invoke(RERUN_INPUT, lg_cfg(args.id), durability="sync"))
        times.append(time.perf_counter() - t)
        per_call.append(EXECUTED["n"] - k)
    after = lg_checkpoints(conn, args.id)
    conn.close()
    return rerun_result(times, executed_total=EXECUTED["n"], executed_first=per_call[0],
                        executed_per_rerun=statistics.median(per_call), calls_per_run=3, checkpoints_before=before,
                        checkpoints_after=after, texts=sorted(texts))


# ================================================================================================
# DBOS steps on SQLite
# ================================================================================================
DBOS_FUNCS: dict = {}


def dbos_imports(args: argparse.Namespace) -> dict:
    import dbos  # noqa: F401

    return {}


def dbos_register(die_after_loop: bool = False) -> None:
    """Register the workflows and steps (before DBOS.launch(), identical in every process)."""
    from dbos import DBOS

    step_fn = DBOS.step()(step)
    calls = (DBOS.step()(model_call), DBOS.step()(lookup), DBOS.step()(final_call))

    @DBOS.workflow()
    def steps_wf(n: int) -> int:
        t = time.perf_counter()
        for i in range(n):
            step_fn(i)
        DBOS_FUNCS["loop_s"] = time.perf_counter() - t
        if die_after_loop:
            emit_result({"calls": EXECUTED["n"], "loop_s": DBOS_FUNCS["loop_s"]})
            os._exit(137)
        return n

    @DBOS.workflow()
    def small_wf(question: str) -> str:
        return small_flow(question, calls)

    DBOS_FUNCS.update(steps_wf=steps_wf, small_wf=small_wf)


def dbos_start(args: argparse.Namespace, db_name: str, die_after_loop: bool = False) -> float:
    dbos_register(die_after_loop)
    return dbos_launch("bench-durable-calls", f"sqlite:///{os.path.join(args.dir, db_name)}", APP_VERSION)


def dbos_overhead(args: argparse.Namespace) -> dict:
    from dbos import SetWorkflowID

    launch_s = dbos_start(args, f"dbos-ovh-{args.round}.sqlite")
    wf = DBOS_FUNCS["steps_wf"]
    with SetWorkflowID(f"warm-{args.round}"):
        wf(20)  # untimed warm-up
    EXECUTED["n"] = 0
    with Usage() as usage:
        with SetWorkflowID(f"ovh-{args.round}"):
            out = wf(args.n)
    assert out == args.n and EXECUTED["n"] == args.n, (out, EXECUTED)
    dbos_destroy()
    return overhead_result(args.n, usage, DBOS_FUNCS["loop_s"], launch_s=launch_s)


def dbos_resume_write(args: argparse.Namespace) -> None:
    from dbos import SetWorkflowID

    dbos_start(args, "dbos-big.sqlite", die_after_loop=True)
    with SetWorkflowID(args.id):
        DBOS_FUNCS["steps_wf"](args.big)
    sys.exit("the DBOS writer was expected to kill itself")


def dbos_resume(args: argparse.Namespace) -> dict:
    from dbos import DBOS

    t0 = time.perf_counter()
    launch_s = dbos_start(args, "dbos-big.sqlite")  # launch recovers PENDING workflows (background thread)
    t1 = time.perf_counter()
    out = DBOS.retrieve_workflow(args.id).get_result(polling_interval_sec=0.01)
    t3 = time.perf_counter()
    status = DBOS.get_workflow_status(args.id)
    dbos_destroy()
    return {"total_s": t3 - t0, "open_s": t1 - t0, "launch_s": launch_s, "recover_to_done_s": t3 - t1,
            "replay_loop_s": DBOS_FUNCS.get("loop_s"), "re_executed": EXECUTED["n"], "completed": out == args.big,
            "result": out, "status": getattr(status, "status", None)}


def dbos_rerun_setup(args: argparse.Namespace) -> dict:
    from dbos import SetWorkflowID

    dbos_start(args, "dbos-fin.sqlite")
    t = time.perf_counter()
    with SetWorkflowID(args.id):
        text = DBOS_FUNCS["small_wf"](RERUN_INPUT)
    out = {"first_run_s": time.perf_counter() - t, "executed": EXECUTED["n"], "text": text}
    dbos_destroy()
    return out


def dbos_rerun(args: argparse.Namespace) -> dict:
    from dbos import SetWorkflowID

    launch_s = dbos_start(args, "dbos-fin.sqlite")
    times, texts = [], set()
    for _ in range(args.reps):
        t = time.perf_counter()
        with SetWorkflowID(args.id):
            texts.add(DBOS_FUNCS["small_wf"](RERUN_INPUT))
        times.append(time.perf_counter() - t)
    dbos_destroy()
    return rerun_result(times, launch_s=launch_s, executed_total=EXECUTED["n"], texts=sorted(texts))


# ================================================================================================
IMPLS = {
    "ours": (ours_imports, {"overhead": ours_overhead, "resume_write": ours_resume_write, "resume": ours_resume,
                            "rerun_setup": ours_rerun_setup, "rerun": ours_rerun}),
    "langgraph": (lg_imports, {"overhead": lg_overhead, "resume_write": lg_resume_write, "resume": lg_resume,
                               "rerun_setup": lg_rerun_setup, "rerun": lg_rerun}),
    "dbos": (dbos_imports, {"overhead": dbos_overhead, "resume_write": dbos_resume_write, "resume": dbos_resume,
                            "rerun_setup": dbos_rerun_setup, "rerun": dbos_rerun}),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", required=True, choices=["floor", *IMPLS])
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--big", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--round", type=int, default=0)
    parser.add_argument("--floor-n", type=int, default=200)
    parser.add_argument("--id", default="big")
    parser.add_argument("--repo", default="")
    parser.add_argument("--profile", default="", help="write cProfile stats of the timed work to this file")
    args = parser.parse_args()

    if args.impl == "floor":
        emit_result({"impl": "floor", "scenario": "floor", **describe(fsync_floor(args.dir, args.floor_n))})
        return
    imports, scenarios = IMPLS[args.impl]
    info = imports(args)
    import_s = time.perf_counter() - T_PROCESS
    floor_before = None
    if args.scenario == "overhead":  # the disk's fsync latency in this process, just before the run (and after it)
        floor_before = fsync_floor(args.dir, 50)
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    result = scenarios[args.scenario](args) or {}
    if profiler is not None:
        profiler.disable()
        with open(args.profile, "w", encoding="utf-8") as out:
            out.write(profile_text(profiler, [("tottime", 30), ("cumulative", 30)]))
    if floor_before is not None:  # this disk switches between ~0.15 and ~4 ms fdatasyncs: bracket the run
        floor_after = fsync_floor(args.dir, 50)
        result["floor_before_us"] = describe(floor_before)["median_us"]
        result["floor_after_us"] = describe(floor_after)["median_us"]
        result["floor_here_us"] = describe(floor_before + floor_after)["median_us"]
    emit_result({"impl": args.impl, "scenario": args.scenario, "import_s": import_s, "info": info, **result})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip slow interpreter/library teardown (everything measured is already durable)


if __name__ == "__main__":
    main()
