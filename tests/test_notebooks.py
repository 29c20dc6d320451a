"""Every notebook in notebooks/ runs top to bottom in a real Jupyter kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, need

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: Path, tmp_path: Path):
    try:
        import nbclient
        import nbformat
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError as exc:  # pragma: no cover - depends on the [test] extra
        need(False, f"nbclient/nbformat/ipykernel not installed ({exc.name})")
    need("python3" in KernelSpecManager().find_kernel_specs(), "no python3 Jupyter kernel (pip install ipykernel)")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    if path.name == "01-durable-basics.ipynb":
        assert "attempt 2 starting after step 3" in text and "waypoint 3:" in text
        last = nb.cells[-1].outputs[0]["data"]["text/plain"]
        assert last == "['report-2.csv', 'report-3.csv', 'report-4.csv']"
