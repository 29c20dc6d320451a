"""bench_fleet.py's report: the setup lines, the tables, the fault lines and the PASS/MISS verdicts
against issue 24's targets (a module of its own so that the harness stays the harness)."""

from __future__ import annotations

import os
import statistics
from typing import Any

from _common import cpu_model, fmt_load, fmt_time, fmt_us, md_table, say, say_verdict

TTL_MS = 3000
LABEL = {"postgres": "PostgreSQL", "http": "journal service (backed by PostgreSQL)", "s3": "S3 (moto)"}
FLOOR_WHAT = {"postgres": "bare 1-row INSERT + COMMIT (autocommit psycopg), same server",
              "http": "bare POST of 152 B to /health, same service (the HTTP store's client, keep-alive)",
              "s3": "bare obstore.put of 152 B to a new key, same moto server"}
PG_RATIO_TARGET, P99_TARGET, TAKEOVER_SLACK_S, RESTART_TARGET_S = 0.5, 10.0, 1.0, 5.0
HTTP_SCALE_TARGET, HTTP_CPU_TARGET_US = 4.0, 200.0


def print_setup(notes: dict, fsync: dict, mount: dict, wanted: list[str], unavailable: dict) -> None:
    v = notes["versions"]
    say(f"machine: {notes['cpu_count']} cores ({cpu_model()}), load average {fmt_load(notes['loadavg_start'])}; "
        f"{notes['platform']}")
    say(f"disk: work dir {notes['workdir']} on {mount['device']} ({mount['fstype']}); write+fdatasync of 100 B: "
        f"median {fmt_us(fsync.get('median_us'))}, p99 {fmt_us(fsync.get('p99_us'))} (n={fsync['n']})")
    say("versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val and k != "sqlite (library)"))
    if "pg_settings" in notes:
        say(f"postgres: {notes['pg']}; " + ", ".join(f"{k}={val}" for k, val in notes["pg_settings"].items()))
    for key in ("service", "s3"):
        if key in notes:
            say(f"{key}: {notes[key]}")
    say(f"leases: lease_ttl_ms={TTL_MS} on every store (renewed every {TTL_MS / 3000:.0f} s, trusted by its holder "
        f"for {0.9 * TTL_MS / 1000:.1f} s)")
    for backend, why in unavailable.items():
        say(f"{backend}: NOT RUN: {why}")
    say(f"measuring: {', '.join(wanted) or 'nothing'}")


def fault_line(f: dict) -> str:
    if "error" in f:
        return f"ERROR {f['error']}"
    if f["scenario"] == "kill":
        times = [t["takeover_s"] for t in f["takeovers"].values()]
        return (f"{f['victims']} of {f['writers']} writers SIGKILLed; takeover "
                + ", ".join(fmt_time(t) if t is not None else "never" for t in times)
                + f"; survivors' LeaseLost: {f['survivor_lease_lost']}")
    if f["scenario"] == "stop":
        fenced = f["victim_fenced"]
        return (f"holder stopped {f['stopped_s']:.1f} s; standby took over after {fmt_time(f['standby_takeover_s'])}; "
                f"the holder's late append: " + (f"{fenced[0]['type']} ({fenced[0]['code']})" if fenced else
                                                 f"NOT refused (errors {f['victim_errors']})"))
    times = [w["from_accepting_s"] for w in f["per_writer"].values()]
    known = [t for t in times if t is not None]
    return (f"down {f['down_s']:.2f} s; appending again after accepting: max "
            f"{fmt_time(max(known)) if known else 'n/a'}, median {fmt_time(statistics.median(known)) if known else 'n/a'}"
            f" ({len(known)}/{len(times)} writers); errors {f['error_codes']}")


def report(bench: Any, wanted: list[str], unavailable: dict, notes: dict, args: Any) -> None:
    for backend in wanted:
        rows = bench.rows.get(backend, [])
        say(f"\n{LABEL[backend]}: acknowledged appends over the window, next to the floor ({FLOOR_WHAT[backend]}) "
            "of as many processes")
        table = []
        for r in rows:
            o, f = r["ours"], r["floor"]
            st, fs = o.get("stats", {}), f.get("stats", {})
            table.append([r["n"], f"{o['per_s']:,.0f}" if o.get("per_s") else "ERROR",
                          f"{r['scaling']:.2f}x" if r.get("scaling") else "-",
                          fmt_us(st.get("median_us")), fmt_us(st.get("p99_us")),
                          f"{st['p99_us'] / st['median_us']:.1f}x" if st.get("median_us") else "-",
                          fmt_us(o.get("client_cpu_us")), fmt_us(o.get("server_cpu_us")),
                          f"{f['per_s']:,.0f}" if f.get("per_s") else "ERROR", fmt_us(fs.get("median_us")),
                          fmt_us(fs.get("p99_us")), fmt_us(f.get("client_cpu_us")), fmt_us(f.get("server_cpu_us")),
                          f"{r['ratio']:.2f}x" if r.get("ratio") else "-",
                          f"{o.get('lease_lost', '-')} / {sum(o.get('errors', {}).values())}"])
        say("\n".join(md_table(["writers", "appends/s", "vs 1 writer", "p50", "p99", "p99/p50", "client CPU/append",
                                "server CPU/append", "floor ops/s", "floor p50", "floor p99", "floor client CPU/op",
                                "floor server CPU/op", "ours/floor", "LeaseLost / errors"], table)))
        for r in rows:
            for kind in ("ours", "floor"):
                if r[kind].get("worker_errors") or r[kind].get("error"):
                    say(f"  {kind} n={r['n']}: {r[kind].get('error') or r[kind]['worker_errors'][:2]}")
        if backend == "http" and rows:
            say("  server CPU per append, split: " + "; ".join(
                f"{r['n']} clients: " + " + ".join(f"{name} {fmt_us(us)}" for name, us in
                                                  r["ours"].get("server_cpu_parts_us", {}).items()) for r in rows))
        if backend == "http" and rows and rows[0]["floor"].get("status_codes"):
            say(f"  (the floor's answers: HTTP status {rows[0]['floor']['status_codes']})")
    # faults
    frows = []
    for backend in wanted:
        for name, f in bench.faults.get(backend, {}).items():
            frows.append([backend, {"kill": "(a) SIGKILL + takeover", "stop": "(b) SIGSTOP past the TTL",
                                    "restart": "(c) PostgreSQL restart" if backend == "postgres" else
                                    "(d) service SIGKILL + restart"}[name], fault_line(f)])
    if frows:
        say("\nfaults (lease TTL 3 s; standbys are already imported and connected when told)")
        say("\n".join(md_table(["backend", "scenario", "measured"], frows, align="lll")))
    crow = []
    for backend in wanted:
        c = bench.checks.get(backend, {})
        t = c.get("totals")
        crow.append([backend, *(["ERROR " + str(c.get("error"))[:80], "", "", "", "", ""] if not t else
                                [t["runs"], f"{t['acked']:,}", t["lost"], t["duplicates"], t["gaps"] + t["out_of_order"],
                                 f"{t['fenced_visible']} of {t['fenced_checked']}"])])
    say("\njournals read back after everything (every run of the scaling fleets and the faults)")
    say("\n".join(md_table(["backend", "runs", "acknowledged appends", "lost", "duplicates", "gaps / out of order",
                            "fenced appends visible"], crow)))
    notes["verdicts"] = verdicts(bench, wanted, args)


def verdicts(bench: Any, wanted: list[str], args: Any) -> dict:
    say("\ntargets")
    out: dict = {}
    ttl = TTL_MS / 1000

    def verdict(key: str, ok: bool | None, target: str, detail: str) -> None:
        out[key] = {"pass": ok, "detail": detail}
        if ok is None:
            say(f"n/a   {target}\n      {detail}")
        else:
            say_verdict(ok, target, detail)

    pg = bench.rows.get("postgres", [])
    big = max(pg, key=lambda r: r["n"]) if pg else None
    if big and big.get("ratio"):
        st = big["ours"]["stats"]
        note = "" if big["n"] == 64 else f" (measured at {big['n']}: the largest fleet of this run)"
        verdict("pg_vs_floor", big["ratio"] >= PG_RATIO_TARGET,
                f"PostgreSQL, 64 writers: aggregate >= {PG_RATIO_TARGET}x the INSERT+COMMIT floor of 64 processes",
                f"{big['ours']['per_s']:,.0f} appends/s vs {big['floor']['per_s']:,.0f} ops/s = {big['ratio']:.2f}x{note}")
        ratio = st["p99_us"] / st["median_us"]
        verdict("pg_p99", ratio <= P99_TARGET, f"PostgreSQL, 64 writers: p99 <= {P99_TARGET:g}x p50",
                f"p50 {fmt_us(st['median_us'])}, p99 {fmt_us(st['p99_us'])} = {ratio:.1f}x{note}")
    elif "postgres" in wanted:
        verdict("pg_vs_floor", False, "PostgreSQL, 64 writers vs the floor", "not measured (see errors above)")
    # no writer loses its own lease without another holder
    lost, where = 0, []
    for backend in wanted:
        for r in bench.rows.get(backend, []):
            if r["ours"].get("lease_lost"):
                lost += r["ours"]["lease_lost"]
                early = r["ours"].get("lease_lost_before_window", 0)
                where.append(f"{backend} n={r['n']}: {r['ours']['lease_lost']} ({early} of them before the window, "
                             "while the rest of the fleet was still starting)")
        for name, f in bench.faults.get(backend, {}).items():
            k = f.get("survivor_lease_lost", 0) + f.get("others_lease_lost", 0) + (
                f.get("lease_lost", 0) if name == "restart" and backend == "postgres" else 0)
            if k:
                lost += k
                where.append(f"{backend} fault {name}: {k}")
    service_restart = bench.faults.get("http", {}).get("restart", {})
    info = (f"; the journal service's SIGKILL ended its clients' leases ({service_restart['lease_lost']} LeaseLost, "
            "expected: its lease table is in memory)" if service_restart.get("lease_lost") else "")
    verdict("own_lease", lost == 0, "no writer loses its own lease without another holder",
            (f"{lost} LeaseLost with no other holder: " + "; ".join(where) if lost else
             "0 LeaseLost in every scaling fleet, among the survivors of (a) and the others of (b)"
             + (" and through the PostgreSQL restart" if "restart" in bench.faults.get("postgres", {}) else "")) + info)
    # takeover
    limit = ttl + TAKEOVER_SLACK_S
    times, missing = {}, []
    for backend in wanted:
        f = bench.faults.get(backend, {}).get("kill")
        if not f:
            continue
        if "error" in f:
            missing.append(f"{backend}: {f['error']}")
            continue
        ts = [t["takeover_s"] for t in f["takeovers"].values()]
        if any(t is None for t in ts):
            missing.append(f"{backend}: a standby never appended")
        times[backend] = max((t for t in ts if t is not None), default=None)
    if times or missing:
        ok = not missing and all(t is not None and t <= limit for t in times.values())
        verdict("takeover", ok, f"takeover after SIGKILL <= lease TTL + {TAKEOVER_SLACK_S:g} s = {limit:g} s on every backend",
                ", ".join(f"{b}: max {fmt_time(t)}" for b, t in times.items()) + ("; " + "; ".join(missing) if missing else "")
                + ("" if len(times) == len(wanted) else f" (measured on {', '.join(times)} only)"))
    f = bench.faults.get("postgres", {}).get("restart")
    if f and "error" not in f:
        ts = [w["from_accepting_s"] for w in f["per_writer"].values()]
        ok = all(t is not None and t <= RESTART_TARGET_S for t in ts)
        known = [t for t in ts if t is not None]
        verdict("pg_restart", ok, f"PostgreSQL restart: every writer appends again within {RESTART_TARGET_S:g} s "
                "of the server accepting connections",
                f"max {fmt_time(max(known)) if known else 'n/a'} over {len(known)}/{len(ts)} writers "
                f"(server down {f['down_s']:.2f} s)")
    elif "postgres" in wanted:
        verdict("pg_restart", None, "PostgreSQL restart within 5 s", "not run (" + (
            "--quick" if args.quick else "--no-faults" if args.no_faults else "--pg-url: not ours to restart") + ")")
    # the journals
    lost = dups = fenced = gaps = checked = unread = 0
    bad = []
    for backend in wanted:
        t = bench.checks.get(backend, {}).get("totals")
        if not t:
            bad.append(f"{backend}: not read ({bench.checks.get(backend, {}).get('error')})")
            continue
        lost, dups, fenced = lost + t["lost"], dups + t["duplicates"], fenced + t["fenced_visible"]
        gaps, checked, unread = gaps + t["gaps"] + t["out_of_order"], checked + t["acked"], unread + t["unreadable"]
    fenced_tried = sum(len(e.get("fenced", [])) for b in wanted for e in bench.runs[b])
    stops = [bench.faults.get(b, {}).get("stop") for b in wanted if bench.faults.get(b, {}).get("stop")]
    unrefused = [s for s in stops if "error" in s or not s["victim_fenced"]]
    verdict("journals", not (lost or dups or fenced or gaps or unread or bad),
            "0 acknowledged appends lost, 0 duplicates, 0 fenced appends visible",
            f"{checked:,} acknowledged appends checked: {lost} lost, {dups} duplicates, {gaps} gaps or out of order, "
            f"{fenced} of {fenced_tried} refused appends visible, {unread} runs unreadable"
            + ("; " + "; ".join(bad) if bad else ""))
    if stops:
        verdict("fenced", not unrefused, "a holder SIGSTOPped past its lease: its late append fails with a typed LeaseLost",
                ", ".join(f"{b}: {bench.faults[b]['stop']['victim_fenced'][0]['type']}" if
                          bench.faults[b].get("stop", {}).get("victim_fenced") else f"{b}: not refused"
                          for b in wanted if "stop" in bench.faults.get(b, {})))
    http = bench.rows.get("http", [])
    one = next((r for r in http if r["n"] == 1 and r["ours"].get("per_s")), None)
    eight = next((r for r in http if r["n"] == 8 and r["ours"].get("per_s")), None)
    if one and eight:
        ratios = [eight["ours"]["per_s"] / one["ours"]["per_s"]]
        ratios += [p["ratio"] for p in bench.pairs.get("http", []) if p["ratio"]]
        x = statistics.median(ratios)
        verdict("http_scale", x >= HTTP_SCALE_TARGET, f"journal service: 8 clients >= {HTTP_SCALE_TARGET:g}x one client",
                f"median {x:.2f}x of {len(ratios)} back-to-back pair{'s' * (len(ratios) > 1)} of windows "
                f"({', '.join(f'{r:.2f}x' for r in ratios)}); in the scaling table {eight['ours']['per_s']:,.0f} vs "
                f"{one['ours']['per_s']:,.0f} appends/s" + cpu_ceiling(one, eight))
    elif http:
        verdict("http_scale", None, "journal service: 8 clients >= 4x one client", "no fleet of 8 in this run")
    at = eight or (http[-1] if http else None)
    if at and at["ours"].get("client_cpu_us"):
        cpu = at["ours"]["client_cpu_us"]
        alone = bench.client_cpu
        verdict("http_cpu", cpu <= HTTP_CPU_TARGET_US, f"journal service: client CPU per append <= {HTTP_CPU_TARGET_US:g} us",
                f"{fmt_us(cpu)} per append with {at['n']} clients (all threads of every client process); a bare "
                f"POST /health costs its client {fmt_us(at['floor'].get('client_cpu_us'))} here; the servers' CPU per "
                f"append: {fmt_us(at['ours'].get('server_cpu_us'))} (service + PostgreSQL)" + (
                    f"; the client alone, in one process with an in-process transport: {fmt_us(alone['at_once_us'])} "
                    f"answered at once, {fmt_us(alone['after_wait_us'])} answered after sleeping "
                    f"{fmt_us(alone['wait_us'])} (what this machine charges a thread that blocks and wakes)"
                    if "at_once_us" in alone else ""))
    return out


def cpu_ceiling(one: dict, eight: dict) -> str:
    """What this machine allows: its cores over the CPU per append (clients + servers) of the 8-client
    fleet, against one client's rate. One client's append is a serial chain (client, service, database),
    so less CPU per append speeds it up too: only more cores, or batching that cuts the CPU per append
    at 8 clients further than at 1, lifts the ceiling."""
    cores = os.cpu_count() or 1
    client, server = eight["ours"].get("client_cpu_us"), eight["ours"].get("server_cpu_us")
    seen = eight["ours"].get("server_cpu_parts_us") or {}
    if not client or not server or not {"service", "postgres"} <= seen.keys() or not one["ours"].get("per_s"):
        return ""  # a PostgreSQL of yours (--pg-url): its CPU is not seen here, so there is no ceiling to tell
    per = client + server
    top = cores / (per / 1e6)
    return (f"; the ceiling here: {cores} cores / {fmt_us(per)} of CPU per append at 8 clients (client + servers) = "
            f"{top:,.0f} appends/s = {top / one['ours']['per_s']:.2f}x one client")
