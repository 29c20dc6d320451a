"""The IPython extension (installed as ``caravanserai.ipython_ext``).

``%load_ext caravanserai`` calls ``load_ipython_extension`` here. The ``%%resumable`` cell magic
and ``%caravanserai`` line magic arrive with the notebook layer; for now loading registers the
``%caravanserai`` line magic's ``list`` and ``show`` subcommands so the extension is usable.
"""

from __future__ import annotations


def load_ipython_extension(ipython) -> None:
    from IPython.core.magic import register_line_magic  # noqa: F401  (IPython is the [notebook] extra)

    from ..cli import main

    def caravanserai(line: str) -> None:
        """%caravanserai list | show RUN: the CLI, inside the notebook."""
        main(line.split())

    ipython.register_magic_function(caravanserai, magic_kind="line", magic_name="caravanserai")


def unload_ipython_extension(ipython) -> None:
    ipython.magics_manager.magics["line"].pop("caravanserai", None)
