"""Worker for ``bench_durable_calls.py``: one scenario of one implementation per process.

    python _durable_calls_worker.py --impl {floor,ours,langgraph,dbos} --scenario SCENARIO --dir WORKDIR [...]

Scenarios (the same shape for every implementation):

- ``floor``: write + fdatasync of a 100 B record appended to a file (implementation ``floor``).
- ``overhead``: one run / entrypoint / workflow of ``--n`` journaled calls of a trivial function
  that returns ~80 B, after an untimed warm-up run of 20 calls; the process first measures the
  fsync floor (50 samples) on the same disk, reported as ``floor_here_us``.
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

# ---- fsync counters (before any implementation is imported; Python-level calls only) ----------
FSYNCS = {"fsync": 0, "fdatasync": 0}
_real_fsync, _real_fdatasync = os.fsync, getattr(os, "fdatasync", os.fsync)


def _counting_fsync(fd):  # noqa: ANN001
    FSYNCS["fsync"] += 1
    return _real_fsync(fd)


def _counting_fdatasync(fd):  # noqa: ANN001
    FSYNCS["fdatasync"] += 1
    return _real_fdatasync(fd)


os.fsync = _counting_fsync
if hasattr(os, "fdatasync"):
    os.fdatasync = _counting_fdatasync

EXECUTED = {"n": 0}  # how many times a journaled function body really ran in this process
RERUN_INPUT = "How big is Samarkand?"
RERUN_REPLIES = 2  # model calls in the small finished run (plus one tool call)
APP_VERSION = "bench-durable-calls"


def payload(i: int) -> dict:
    """~80 B as compact JSON: {"i":123,"text":"step 00123 ................................................"}."""
    return {"i": i, "text": f"step {i:05d} " + "." * 48}


def emit(result: dict) -> None:
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


def plain_loop_us(n: int) -> float:
    """Time of ``n`` direct calls of the trivial function (min of 5), in µs."""
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for i in range(n):
            payload(i)
        best = min(best, time.perf_counter() - t)
    return best * 1e6


# ================================================================================================
# floor
# ================================================================================================
def floor(args: argparse.Namespace) -> dict:
    path = os.path.join(args.dir, "fsync-floor.bin")
    record = (b"x" * 99) + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    samples = []
    try:
        for k in range(args.floor_n + 5):
            t = time.perf_counter()
            os.write(fd, record)
            _real_fdatasync(fd)
            if k >= 5:
                samples.append((time.perf_counter() - t) * 1e6)
    finally:
        os.close(fd)
        os.unlink(path)
    samples.sort()
    return {"n": len(samples), "median_us": statistics.median(samples), "mean_us": statistics.fmean(samples),
            "p90_us": samples[int(0.9 * (len(samples) - 1))], "min_us": samples[0], "max_us": samples[-1]}


# ================================================================================================
# ours
# ================================================================================================
def ours_imports() -> dict:
    import caravanserai  # noqa: F401
    from caravanserai.testing import ScriptedModel  # noqa: F401

    try:
        import importlib.metadata as md
        meta = md.version("caravanserai")
    except Exception:  # pragma: no cover
        meta = None
    info = {"caravanserai": getattr(caravanserai, "__version__", None), "metadata": meta, "file": caravanserai.__file__}
    if args_global.repo and not os.path.realpath(caravanserai.__file__).startswith(os.path.realpath(args_global.repo)):
        sys.exit(f"[worker ours] imported caravanserai from {caravanserai.__file__}, not from {args_global.repo}")
    return info


def ours_step(i: int) -> dict:
    EXECUTED["n"] += 1
    return payload(i)


def ours_overhead(args: argparse.Namespace) -> dict:
    import caravanserai

    store = os.path.join(args.dir, "ours-store")
    with caravanserai.durable(f"warm-{args.round}", store=store) as run:  # untimed warm-up
        for i in range(20):
            run.call_tool(ours_step, {"i": i}, name="step", effect="read")
    EXECUTED["n"] = 0
    FSYNCS.update(fsync=0, fdatasync=0)
    n = args.n
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    with caravanserai.durable(f"ovh-{args.round}", store=store) as run:
        t1 = time.perf_counter()
        for i in range(n):
            run.call_tool(ours_step, {"i": i}, name="step", effect="read")
        t2 = time.perf_counter()
    t3 = time.perf_counter()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    user, system = cpu1.ru_utime - cpu0.ru_utime, cpu1.ru_stime - cpu0.ru_stime
    assert EXECUTED["n"] == n, EXECUTED
    fsyncs = FSYNCS["fsync"] + FSYNCS["fdatasync"]
    return {"n": n, "total_s": t3 - t0, "loop_s": t2 - t1, "cpu_s": user + system, "user_s": user, "sys_s": system,
            "plain_loop_us": plain_loop_us(n),
            "fsyncs": fsyncs, "fsyncs_per_call": fsyncs / n, "executed": EXECUTED["n"]}


def ours_resume_write(args: argparse.Namespace) -> None:
    import caravanserai

    store = os.path.join(args.dir, "ours-store")
    t0 = time.perf_counter()
    with caravanserai.durable(args.id, store=store) as run:
        for i in range(args.big):
            run.call_tool(ours_step, {"i": i}, name="step")
        emit({"calls": EXECUTED["n"], "write_s": time.perf_counter() - t0,
              "fsyncs": FSYNCS["fsync"] + FSYNCS["fdatasync"]})
        os._exit(137)  # killed before the run finishes: no run_completed, no lease release


def ours_resume(args: argparse.Namespace, import_s: float) -> dict:
    import caravanserai

    store = os.path.join(args.dir, "ours-store")
    t0 = time.perf_counter()
    with caravanserai.durable(args.id, store=store) as run:
        t1 = time.perf_counter()
        attempt = run.attempt
        for i in range(args.big):
            run.call_tool(ours_step, {"i": i}, name="step")
        t2 = time.perf_counter()
    t3 = time.perf_counter()
    return {"total_s": t3 - t0, "open_s": t1 - t0, "replay_loop_s": t2 - t1, "close_s": t3 - t2,
            "re_executed": EXECUTED["n"], "attempt": attempt, "completed": run.completed,
            "journal_bytes": os.path.getsize(os.path.join(store, args.id, "journal.jsonl"))}


def ours_agent():
    import caravanserai
    from caravanserai.testing import ScriptedModel

    def lookup(city: str) -> dict:
        EXECUTED["n"] += 1
        return {"city": city, "population": 500_000}

    model = ScriptedModel([ScriptedModel.tool("lookup", city="Samarkand"), "Samarkand has about 500,000 people."])
    agent = caravanserai.agent(id="bench-agent", instructions="Answer briefly.", model=model,
                               tools=[caravanserai.tool(lookup, effect="read")])
    return model, agent


def ours_rerun_setup(args: argparse.Namespace) -> dict:
    import caravanserai

    model, agent = ours_agent()
    t = time.perf_counter()
    result = caravanserai.run(agent, RERUN_INPUT, durable={"run_id": args.id, "store": os.path.join(args.dir, "ours-store")})
    return {"first_run_s": time.perf_counter() - t, "model_requests": len(model.requests), "tool_calls": EXECUTED["n"],
            "text": result.text, "replayed": result.replayed}


def ours_rerun(args: argparse.Namespace) -> dict:
    import caravanserai

    store = os.path.join(args.dir, "ours-store")
    times, requests, replayed, texts = [], 0, [], set()
    for _ in range(args.reps):
        model, agent = ours_agent()  # a fresh model each time: any request would show in model.requests
        t = time.perf_counter()
        result = caravanserai.run(agent, RERUN_INPUT, durable={"run_id": args.id, "store": store})
        times.append(time.perf_counter() - t)
        assert len(model.requests) == 0, f"re-run called the model {len(model.requests)} times"
        requests += len(model.requests)
        replayed.append(result.replayed)
        texts.add(result.text)
    return {"first_s": times[0], "warm_median_s": statistics.median(times[1:]) if len(times) > 1 else None,
            "warm_p90_s": sorted(times[1:])[int(0.9 * (len(times) - 2))] if len(times) > 2 else None,
            "reps": len(times), "model_requests": requests, "tool_calls": EXECUTED["n"],
            "all_replayed": all(replayed), "texts": sorted(texts)}


# ================================================================================================
# LangGraph functional API + SqliteSaver, durability="sync"
# ================================================================================================
def lg_imports() -> dict:
    import sqlite3  # noqa: F401

    import langgraph  # noqa: F401
    from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: F401
    from langgraph.func import entrypoint, task  # noqa: F401

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

    @task
    def step(i: int) -> dict:
        EXECUTED["n"] += 1
        return payload(i)

    @entrypoint(checkpointer=saver)
    def main(n: int) -> int:
        t = time.perf_counter()
        for i in range(n):
            step(i).result()
        timing["loop_s"] = time.perf_counter() - t
        if die_after_loop:
            emit({"calls": EXECUTED["n"], "loop_s": timing["loop_s"]})
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
    n = args.n
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    out = main.invoke(n, lg_cfg(f"ovh-{args.round}"), durability="sync")
    t3 = time.perf_counter()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    user, system = cpu1.ru_utime - cpu0.ru_utime, cpu1.ru_stime - cpu0.ru_stime
    assert out == n and EXECUTED["n"] == n, (out, EXECUTED)
    conn.close()
    return {"n": n, "total_s": t3 - t0, "loop_s": timing["loop_s"], "cpu_s": user + system, "user_s": user, "sys_s": system,
            "plain_loop_us": plain_loop_us(n),
            "executed": EXECUTED["n"]}


def lg_resume_write(args: argparse.Namespace) -> None:
    conn, saver = lg_saver(os.path.join(args.dir, "lg-big.sqlite"))
    main, _ = lg_steps(saver, die_after_loop=True)
    main.invoke(args.big, lg_cfg(args.id), durability="sync")
    sys.exit("the LangGraph writer was expected to kill itself")


def lg_resume(args: argparse.Namespace, import_s: float) -> dict:
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

    @task
    def model_call(messages: list) -> dict:
        EXECUTED["n"] += 1
        return {"role": "assistant", "content": "", "tool_calls": [{"name": "lookup", "arguments": {"city": "Samarkand"}}]}

    @task
    def lookup(city: str) -> dict:
        EXECUTED["n"] += 1
        return {"city": city, "population": 500_000}

    @task
    def final_call(messages: list) -> dict:
        EXECUTED["n"] += 1
        return {"role": "assistant", "content": "Samarkand has about 500,000 people."}

    @entrypoint(checkpointer=saver)
    def small(question: str) -> str:
        messages = [{"role": "user", "content": question}]
        first = model_call(messages).result()
        tool = lookup("Samarkand").result()
        final = final_call(messages + [first, {"role": "tool", "content": json.dumps(tool)}]).result()
        return final["content"]

    return small


def lg_checkpoints(conn, thread: str) -> int:
    return conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = ?", (thread,)).fetchone()[0]


def lg_rerun_setup(args: argparse.Namespace) -> dict:
    conn, saver = lg_saver(os.path.join(args.dir, "lg-fin.sqlite"))
    small = lg_small(saver)
    t = time.perf_counter()
    text = small.invoke(RERUN_INPUT, lg_cfg(args.id), durability="sync")
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
    return {"first_s": times[0], "warm_median_s": statistics.median(times[1:]) if len(times) > 1 else None,
            "reps": len(times), "executed_total": EXECUTED["n"], "executed_first": per_call[0],
            "executed_per_rerun": statistics.median(per_call), "calls_per_run": 3,
            "checkpoints_before": before, "checkpoints_after": after, "texts": sorted(texts)}


# ================================================================================================
# DBOS steps on SQLite
# ================================================================================================
DBOS_FUNCS: dict = {}


def dbos_imports() -> dict:
    from dbos import DBOS, SetWorkflowID  # noqa: F401

    return {}


def dbos_register(die_after_loop: bool = False) -> None:
    """Register the workflows and steps (before DBOS.launch(), identical in every process)."""
    from dbos import DBOS

    @DBOS.step()
    def step(i: int) -> dict:
        EXECUTED["n"] += 1
        return payload(i)

    @DBOS.workflow()
    def steps_wf(n: int) -> int:
        t = time.perf_counter()
        for i in range(n):
            step(i)
        DBOS_FUNCS["loop_s"] = time.perf_counter() - t
        if DBOS_FUNCS.get("die_after_loop"):
            emit({"calls": EXECUTED["n"], "loop_s": DBOS_FUNCS["loop_s"]})
            os._exit(137)
        return n

    @DBOS.step()
    def model_call(messages: list) -> dict:
        EXECUTED["n"] += 1
        return {"role": "assistant", "content": "", "tool_calls": [{"name": "lookup", "arguments": {"city": "Samarkand"}}]}

    @DBOS.step()
    def lookup(city: str) -> dict:
        EXECUTED["n"] += 1
        return {"city": city, "population": 500_000}

    @DBOS.step()
    def final_call(messages: list) -> dict:
        EXECUTED["n"] += 1
        return {"role": "assistant", "content": "Samarkand has about 500,000 people."}

    @DBOS.workflow()
    def small_wf(question: str) -> str:
        messages = [{"role": "user", "content": question}]
        first = model_call(messages)
        tool = lookup("Samarkand")
        final = final_call(messages + [first, {"role": "tool", "content": json.dumps(tool)}])
        return final["content"]

    DBOS_FUNCS.update(steps_wf=steps_wf, small_wf=small_wf, die_after_loop=die_after_loop)


def dbos_launch(args: argparse.Namespace, db_name: str) -> float:
    """Configure and launch DBOS on a SQLite system database; returns the launch time in seconds."""
    import logging

    from dbos import DBOS

    t = time.perf_counter()
    DBOS(config={"name": "bench-durable-calls", "system_database_url": f"sqlite:///{os.path.join(args.dir, db_name)}",
                 "application_version": APP_VERSION, "log_level": "WARNING", "console_log_level": "WARNING"})
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)
    return time.perf_counter() - t


def dbos_shutdown() -> None:
    from dbos import DBOS

    try:
        DBOS.destroy(destroy_registry=True)
    except Exception:
        pass


def dbos_overhead(args: argparse.Namespace) -> dict:
    from dbos import SetWorkflowID

    dbos_register()
    launch_s = dbos_launch(args, f"dbos-ovh-{args.round}.sqlite")
    wf = DBOS_FUNCS["steps_wf"]
    with SetWorkflowID(f"warm-{args.round}"):
        wf(20)  # untimed warm-up
    EXECUTED["n"] = 0
    n = args.n
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    with SetWorkflowID(f"ovh-{args.round}"):
        out = wf(n)
    t3 = time.perf_counter()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    user, system = cpu1.ru_utime - cpu0.ru_utime, cpu1.ru_stime - cpu0.ru_stime
    assert out == n and EXECUTED["n"] == n, (out, EXECUTED)
    dbos_shutdown()
    return {"n": n, "total_s": t3 - t0, "loop_s": DBOS_FUNCS["loop_s"], "cpu_s": user + system, "user_s": user, "sys_s": system,
            "plain_loop_us": plain_loop_us(n),
            "executed": EXECUTED["n"], "launch_s": launch_s}


def dbos_resume_write(args: argparse.Namespace) -> None:
    from dbos import SetWorkflowID

    dbos_register(die_after_loop=True)
    dbos_launch(args, "dbos-big.sqlite")
    with SetWorkflowID(args.id):
        DBOS_FUNCS["steps_wf"](args.big)
    sys.exit("the DBOS writer was expected to kill itself")


def dbos_resume(args: argparse.Namespace, import_s: float) -> dict:
    from dbos import DBOS

    t0 = time.perf_counter()
    dbos_register()
    launch_s = dbos_launch(args, "dbos-big.sqlite")  # launch recovers PENDING workflows (background thread)
    t1 = time.perf_counter()
    out = DBOS.retrieve_workflow(args.id).get_result(polling_interval_sec=0.01)
    t3 = time.perf_counter()
    status = DBOS.get_workflow_status(args.id)
    dbos_shutdown()
    return {"total_s": t3 - t0, "open_s": t1 - t0, "launch_s": launch_s, "recover_to_done_s": t3 - t1,
            "replay_loop_s": DBOS_FUNCS.get("loop_s"), "re_executed": EXECUTED["n"], "completed": out == args.big,
            "result": out, "status": getattr(status, "status", None)}


def dbos_rerun_setup(args: argparse.Namespace) -> dict:
    from dbos import SetWorkflowID

    dbos_register()
    dbos_launch(args, "dbos-fin.sqlite")
    t = time.perf_counter()
    with SetWorkflowID(args.id):
        text = DBOS_FUNCS["small_wf"](RERUN_INPUT)
    out = {"first_run_s": time.perf_counter() - t, "executed": EXECUTED["n"], "text": text}
    dbos_shutdown()
    return out


def dbos_rerun(args: argparse.Namespace) -> dict:
    from dbos import SetWorkflowID

    dbos_register()
    launch_s = dbos_launch(args, "dbos-fin.sqlite")
    times, texts = [], set()
    for _ in range(args.reps):
        t = time.perf_counter()
        with SetWorkflowID(args.id):
            texts.add(DBOS_FUNCS["small_wf"](RERUN_INPUT))
        times.append(time.perf_counter() - t)
    dbos_shutdown()
    return {"first_s": times[0], "warm_median_s": statistics.median(times[1:]) if len(times) > 1 else None,
            "reps": len(times), "launch_s": launch_s, "executed_total": EXECUTED["n"], "texts": sorted(texts)}


# ================================================================================================
IMPLS = {
    "ours": (ours_imports, {"overhead": ours_overhead, "resume_write": ours_resume_write, "resume": ours_resume,
                            "rerun_setup": ours_rerun_setup, "rerun": ours_rerun}),
    "langgraph": (lg_imports, {"overhead": lg_overhead, "resume_write": lg_resume_write, "resume": lg_resume,
                               "rerun_setup": lg_rerun_setup, "rerun": lg_rerun}),
    "dbos": (dbos_imports, {"overhead": dbos_overhead, "resume_write": dbos_resume_write, "resume": dbos_resume,
                            "rerun_setup": dbos_rerun_setup, "rerun": dbos_rerun}),
}

args_global: argparse.Namespace


def main() -> None:
    global args_global
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
    args = args_global = parser.parse_args()

    if args.impl == "floor":
        emit({"impl": "floor", "scenario": "floor", **floor(args)})
        return
    imports, scenarios = IMPLS[args.impl]
    info = imports()
    import_s = time.perf_counter() - T_PROCESS
    local_floor = None
    if args.scenario == "overhead":  # the disk's fsync latency right now, in this process
        local_floor = floor(argparse.Namespace(dir=args.dir, floor_n=50))["median_us"]
    fn = scenarios[args.scenario]
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    if args.scenario in ("resume",):
        result = fn(args, import_s)
    else:
        result = fn(args)
    if profiler is not None:
        profiler.disable()
        import io
        import pstats

        with open(args.profile, "w", encoding="utf-8") as out:
            for key in ("tottime", "cumulative"):
                buf = io.StringIO()
                pstats.Stats(profiler, stream=buf).sort_stats(key).print_stats(30)
                out.write(f"==== sorted by {key} ====\n{buf.getvalue()}\n")
    if local_floor is not None:
        result["floor_here_us"] = local_floor
    emit({"impl": args.impl, "scenario": args.scenario, "import_s": import_s, "info": info, **(result or {})})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip slow interpreter/library teardown (everything measured is already durable)


if __name__ == "__main__":
    main()
