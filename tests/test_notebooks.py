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
    def expected_error(cell) -> bool:
        return "raises-exception" in cell.get("metadata", {}).get("tags", [])

    errors = [o for c in nb.cells if c.cell_type == "code" and not expected_error(c)
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    if path.name == "01-durable-basics.ipynb":
        assert "attempt 2 starting after step 3" in text and "waypoint 3:" in text
        last = nb.cells[-1].outputs[0]["data"]["text/plain"]
        assert last == "['report-2.csv', 'report-3.csv', 'report-4.csv']"
    if path.name == "02-resumable-cells.ipynb":
        text = {i: "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in c.get("outputs", []))
                for i, c in enumerate(nb.cells) if c.cell_type == "code"}
        assert "KeyboardInterrupt" in str(nb.cells[3].outputs) and "added 3" in text[3]
        assert "CellChanged" in str(nb.cells[6].outputs) and "--fork" in str(nb.cells[6].outputs)
        assert "added 3" in text[8] and "added 2" not in text[8] and "221" in text[8]  # 0+1+4 restored, then cubes
        assert "added 3" in text[10] and "added 0" not in text[10] and "55" in text[10]  # resumed at item 3
        assert "completed earlier" in text[12] and "55" in text[12] and "added" in text[12]  # output re-shown
