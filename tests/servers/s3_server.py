"""A real S3-compatible server on loopback for tests: moto's server (honours If-None-Match/If-Match).

    server = S3Server.start(); server.create_bucket("b"); ...; server.stop()
Only 127.0.0.1 is used; credentials are dummies; nothing reaches a cloud endpoint.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

from ._proc import free_port, stop_process_group

CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}


def available() -> bool:
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class S3Server:
    proc: subprocess.Popen
    endpoint: str

    @classmethod
    def start(cls, timeout: float = 30.0) -> S3Server:
        port = free_port()
        exe = shutil.which("moto_server", path=os.path.dirname(sys.executable))
        cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
        proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
                return cls(proc, endpoint)
            except OSError as err:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError("moto_server did not start") from err
                time.sleep(0.05)

    def create_bucket(self, name: str) -> None:
        import boto3  # installed with moto

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=CREDENTIALS["access_key_id"],
                     aws_secret_access_key=CREDENTIALS["secret_access_key"],
                     region_name=CREDENTIALS["region"]).create_bucket(Bucket=name)

    def config(self) -> dict:
        return {"endpoint": self.endpoint, **CREDENTIALS}

    def stop(self) -> None:
        stop_process_group(self.proc, grace=5)
