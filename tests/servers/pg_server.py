"""A throwaway PostgreSQL server on loopback for tests (Debian's binaries, run as the postgres user).

``TEST_PG_DSN`` (set by .ci/run when it started one) is used as is; otherwise ``start()``
initialises a cluster in a temporary directory and starts it on a free 127.0.0.1 port.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from ._proc import free_port


def binaries() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@dataclass
class PgServer:
    dsn: str
    data_dir: str | None = None
    bin_dir: str | None = None
    options: str = ""  # the server's command-line options (pg_ctl -o), to start it again the same way

    @classmethod
    def start(cls, *, private: bool = False) -> PgServer:
        """The server TEST_PG_DSN names, or (always, when ``private``: a test that restarts it) a new cluster."""
        if os.environ.get("TEST_PG_DSN") and not private:
            return cls(os.environ["TEST_PG_DSN"])
        bin_dir = binaries()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL binaries not found (apt-get install postgresql)")
        base = tempfile.mkdtemp(prefix="caravanserai-pg-")
        os.chmod(base, 0o755)
        if os.geteuid() == 0:
            shutil.chown(base, "postgres")
        port = free_port()
        data = os.path.join(base, "data")
        subprocess.run(_as_postgres([f"{bin_dir}/initdb", "-N", "-D", data, "-U", "postgres", "--auth=trust",
                                     "-E", "UTF8", "--no-locale"]), check=True, capture_output=True)
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {base} -c fsync=on"
        subprocess.run(_as_postgres([f"{bin_dir}/pg_ctl", "-D", data, "-l", os.path.join(base, "log"), "-w", "-t", "60",
                                     "-o", options, "start"]), check=True, capture_output=True)
        return cls(f"postgresql://postgres@127.0.0.1:{port}/postgres", data, bin_dir, options)

    def _ctl(self, *args: str) -> None:
        subprocess.run(_as_postgres([f"{self.bin_dir}/pg_ctl", "-D", self.data_dir, "-w", "-t", "60", *args]),
                       check=True, capture_output=True)

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is dropped; returns once the server accepts again."""
        assert self.data_dir, "only a private server can be restarted"
        self._ctl("-l", os.path.join(os.path.dirname(self.data_dir), "log"), "restart", "-m", "fast")

    def pause(self) -> None:
        """Stop the server (``-m fast``) until ``resume``: the store cannot be reached meanwhile."""
        assert self.data_dir, "only a private server can be stopped"
        self._ctl("stop", "-m", "fast")

    def resume(self) -> None:
        """Start it again after ``pause``, with the options it had (postmaster.opts)."""
        self._ctl("-l", os.path.join(os.path.dirname(self.data_dir), "log"), "-o", self.options, "start")

    def stop(self) -> None:
        if self.data_dir:
            subprocess.run(_as_postgres([f"{self.bin_dir}/pg_ctl", "-D", self.data_dir, "stop", "-m", "fast"]),
                           capture_output=True)
            shutil.rmtree(os.path.dirname(self.data_dir), ignore_errors=True)


def available() -> bool:
    return bool(os.environ.get("TEST_PG_DSN")) or binaries() is not None
