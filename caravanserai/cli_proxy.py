"""``caravanserai proxy RUN UPSTREAM [-- COMMAND ...]``: a journaling proxy for a command line.

Opens run RUN (a new one, or a resume of it) and serves ``run.proxy_url(UPSTREAM)`` on loopback.
With a command, runs it with ``CARAVANSERAI_PROXY_URL`` and the SDKs' base-URL variable for that
upstream (``ANTHROPIC_BASE_URL`` for an Anthropic host, else ``OPENAI_BASE_URL``; ``--env NAME``
names another) set to the proxy's URL, so its model requests (any language, any client: the
Claude Code CLI, a Node script) are journaled and a re-run with the same RUN replays the settled
ones; the command's exit status is the proxy's. Without one, it prints the URL and
serves until Ctrl-C (the run stays resumable).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from typing import Any

__all__ = ["add_proxy_command"]



class CommandFailed(SystemExit):
    """The proxied command exited non-zero: the run records it as failed; the CLI exits with its status."""


def cmd_proxy(args: argparse.Namespace) -> int:
    from .calls.http_proxy import check_upstream
    from .runs.lifecycle import durable

    check_upstream(args.upstream)  # before the run is opened: a bad URL writes nothing
    command = list(args.program or [])
    with durable(args.run_id, store=args.store) as run:
        url = run.proxy_url(args.upstream)
        print(f"caravanserai: journaling proxy for {args.upstream} at {url} (run {run.run_id!r}, attempt {run.attempt})",
              file=sys.stderr, flush=True)
        if not command:
            print(url, flush=True)
            threading.Event().wait()  # until Ctrl-C: KeyboardInterrupt leaves the run pending
        names = args.env or ["ANTHROPIC_BASE_URL" if "anthropic" in args.upstream.lower() else "OPENAI_BASE_URL"]
        env = {**os.environ, "CARAVANSERAI_PROXY_URL": url, **{name: url for name in names}}
        returncode = subprocess.call(command, env=env)
        if returncode != 0:
            raise CommandFailed(returncode)
        print(run.receipt().summary(), file=sys.stderr)
    return 0


def add_proxy_command(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("proxy", parents=[common],
                       help="journal a command's model requests through a loopback proxy (any language, any client)")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("upstream", metavar="UPSTREAM", help="the model API the proxy stands for, e.g. https://api.anthropic.com")
    p.add_argument("program", nargs="*", metavar="-- COMMAND",
                   help="run this with its base-URL variable set to the proxy (default: serve until Ctrl-C)")
    p.add_argument("--env", action="append", metavar="NAME",
                   help="the variable(s) to set to the proxy's URL (default: ANTHROPIC_BASE_URL for an Anthropic "
                        "upstream, else OPENAI_BASE_URL); CARAVANSERAI_PROXY_URL is always set")
    p.set_defaults(func=cmd_proxy)
