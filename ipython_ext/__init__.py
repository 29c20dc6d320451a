"""The IPython extension (installed as ``caravanserai.ipython_ext``): ``%load_ext caravanserai``.

Registers ``%%resumable`` (as an input transformer + AST transformer, see ``transform.py``),
the ``%caravanserai`` line magic, and puts the cell runtime in the user namespace under a
private name. ``%unload_ext caravanserai`` removes all of it.
"""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    from .cell import CellRun
    from .magics import CaravanseraiMagics
    from .transform import FACTORY, WrapCell, cleanup

    if cleanup not in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.append(cleanup)
    if not any(isinstance(t, WrapCell) for t in ipython.ast_transformers):
        ipython.ast_transformers.append(WrapCell())
    ipython.user_ns[FACTORY] = CellRun
    ipython.register_magics(CaravanseraiMagics)


def unload_ipython_extension(ipython: Any) -> None:
    from .transform import FACTORY, INSTANCE, WrapCell, cleanup

    ipython.input_transformers_cleanup[:] = [t for t in ipython.input_transformers_cleanup if t is not cleanup]
    ipython.ast_transformers[:] = [t for t in ipython.ast_transformers if not isinstance(t, WrapCell)]
    for name in (FACTORY, INSTANCE):
        ipython.user_ns.pop(name, None)
    for kind in ("line", "cell"):
        magics = ipython.magics_manager.magics[kind]
        for name in ("caravanserai", "resumable"):
            magics.pop(name, None)
