"""binder/ alone produces an environment that runs every notebook.

What mybinder.org (repo2docker) does with our files, without Docker: copy the repository as a fresh
clone has it (tracked and untracked-but-not-ignored files: no .venv, no build/, no egg-info), create a
new venv with the Python that ``binder/runtime.txt`` names, ``pip install -r binder/requirements.txt``
from the repository root (nothing else is installed), run ``binder/postBuild`` if there is one, and
execute every notebook in a kernel of that venv. Nothing is reused between runs (a new venv every
time; pip's download cache only saves bandwidth, it cannot hide a broken file), so a requirement
missing from binder/ fails here. Needs PyPI; skips locally without it (fails under CI=true).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, need, need_kernel_packages
from test_notebooks import CHECKS, NOTEBOOKS, unexpected_errors

BINDER = REPO / "binder"


def pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return os.environ.get("PIP_INDEX_URL") is not None  # a mirror


def fresh_clone(dest: Path) -> Path:
    """The files a clone of the working tree would have: tracked plus untracked-not-ignored."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # a deleted-but-tracked file is not in a clone of the working tree
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def test_binder_files_are_the_ones_repo2docker_reads():
    names = {p.name for p in BINDER.iterdir()}
    assert {"requirements.txt", "runtime.txt"} <= names
    assert not names & {"Dockerfile", "environment.yml"}  # either would make repo2docker ignore requirements.txt
    lines = [line.split("#")[0].strip() for line in (BINDER / "requirements.txt").read_text().splitlines()]
    assert ".[notebook]" in lines
    assert (BINDER / "runtime.txt").read_text().strip().startswith("python-3.")


@pytest.mark.slow
def test_a_fresh_venv_from_binder_files_runs_every_notebook(tmp_path: Path):
    need_kernel_packages()  # nbclient runs here; the kernel runs in the binder venv
    need(pypi_reachable(), "PyPI is not reachable: cannot build the Binder environment")
    version = (BINDER / "runtime.txt").read_text().strip().removeprefix("python-")
    python = shutil.which(f"python{version}")
    need(python is not None, f"python{version} (binder/runtime.txt) is not installed")
    assert python is not None

    clone = fresh_clone(tmp_path / "clone")
    venv = tmp_path / "binder-venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARAVANSERAI_", "PYTHON", "VIRTUAL_ENV"))}
    subprocess.run([python, "-m", "venv", str(venv)], check=True, env=env)
    py = venv / "bin" / "python"
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", "-r", "binder/requirements.txt"], cwd=clone,
                             env=env, capture_output=True, text=True, timeout=1500)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    if (clone / "binder" / "postBuild").exists():
        subprocess.run(["bash", "binder/postBuild"], cwd=clone, check=True, env={**env, "PATH": f"{venv}/bin:{env['PATH']}"})
    where = subprocess.run([str(py), "-c", "import caravanserai, caravanserai.widgets; print(caravanserai.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout
    assert str(venv) in where  # installed into the venv, not found in this checkout

    # a kernelspec that starts the binder venv's Python (a plain "python3" would start this one's)
    kernels = tmp_path / "jupyter" / "kernels" / "binder"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(py), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "binder venv", "language": "python"}))
    kernel_env = {**env, "PATH": f"{venv}/bin:{env['PATH']}", "IPYTHONDIR": str(tmp_path / ".ipython"),
                  "DEMO_POSTGRES_URL": "postgresql://postgres@127.0.0.1:9/postgres",  # unreachable: 05 says how to start one
                  "DEMO_S3_URL": "s3://runs/team?endpoint=http://127.0.0.1:9&region=us-east-1",
                  "NB02_SECONDS_PER_ITEM": "0.5"}  # notebook 02's pace for a person to click Restart, not needed here

    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient

    specs = KernelSpecManager(kernel_dirs=[str(kernels.parent)])
    for path in NOTEBOOKS:
        project = tmp_path / path.stem
        project.mkdir()
        nb = nbformat.read(clone / "notebooks" / path.name, as_version=4)
        client = NotebookClient(nb, timeout=300, kernel_name="binder", resources={"metadata": {"path": str(project)}},
                                kernel_manager_class=_manager_with(specs))
        client.execute(env=kernel_env)
        assert unexpected_errors(nb) == [], path.name
        CHECKS[path.name[:2]](nb)


def _manager_with(specs):
    from jupyter_client import KernelManager

    class BinderKernelManager(KernelManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.kernel_spec_manager = specs

    return BinderKernelManager
