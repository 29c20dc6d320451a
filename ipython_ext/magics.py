"""``%caravanserai`` (list, show, store, clean, trust, journal) and the ``%%resumable`` entry."""

from __future__ import annotations

import os
import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from caravanserai import cli
from caravanserai.errors import UsageError as CaravanseraiUsageError
from caravanserai.runs.trust import trust_store
from caravanserai.stores import ENV_VAR, open_store
from caravanserai.stores.urls import redact

from .cell import parser
from .transform import MAGIC


@magics_class
class CaravanseraiMagics(Magics):
    @line_magic
    def caravanserai(self, line: str) -> None:
        """%caravanserai list | show RUN [--all] | journal RUN | clean RUN | store [URL] | trust URL | --help

        ``store URL`` sets the default store for this session; ``trust URL`` trusts that store in this
        session: its unsigned pickled variables load, its outputs re-show in full (only for stores you
        control). ``trust --key KEY`` trusts a colleague's signing key, as ``caravanserai trust`` does.
        Any other words are the ``caravanserai`` command line (``%caravanserai verify``...).
        """
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"%caravanserai {line}: {exc}") from None
        if not words:
            print(type(self).caravanserai.__doc__)  # the function's docstring (no bound method for mypy)
            return
        if words[0] == "store" and len(words) <= 2:
            if len(words) == 1:
                print(open_store().url)
                return
            os.environ[ENV_VAR] = open_store(words[1]).opened_url or open_store(words[1]).url
            print(f"default store for this session: {redact(os.environ[ENV_VAR])}")
            return
        if words[0] == "trust" and len(words) == 2 and not words[1].startswith("-"):  # else: the CLI's trust --key/--store
            trust_store(open_store(words[1]).url)
            print(f"everything in {open_store(words[1]).url} is trusted in this session (pickled values, launch commands, "
                  "outputs); caravanserai trust --store makes it lasting")
            return
        if words[0] == "show" and self._show_panels(words):
            return
        try:
            cli.run_command(words)
        except CaravanseraiUsageError as exc:
            raise UsageError(f"%caravanserai: {exc.message}") from None
        except SystemExit:
            pass  # --help printed its text

    def _show_panels(self, words: list[str]) -> bool:
        """``%caravanserai show RUN [--store URL]`` in a notebook: the run's dashboard (Timeline,
        Journal, Charts). False (the CLI's text) in a terminal, or with --all/--json."""
        if type(self.shell).__name__ != "ZMQInteractiveShell" or "--all" in words or "--json" in words:
            return False
        try:
            args = cli.build_parser().parse_args(words)
            from caravanserai.widgets import show
        except (CaravanseraiUsageError, ImportError):
            return False  # the CLI says what is wrong, or the text is all there is without [notebook]
        show(args.run_id, getattr(args, "store", None))
        return True

    @cell_magic
    def resumable(self, line: str, cell: str) -> None:
        """Run this cell as a durable run (see ``%%resumable?``); the extension's transformers do the work."""
        shell = self.shell
        assert shell is not None  # a magic runs inside the shell that registered it
        result = shell.run_cell(f"{MAGIC} {line}\n{cell}", store_history=False)
        if result.error_before_exec is not None:
            raise result.error_before_exec
        if result.error_in_exec is not None:
            raise result.error_in_exec


CaravanseraiMagics.resumable.__doc__ = (CaravanseraiMagics.resumable.__doc__ or "") + "\n\n" + parser().format_help()
