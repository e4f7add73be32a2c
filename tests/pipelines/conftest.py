"""A real S3-compatible server on 127.0.0.1 for the object-store tests (moto's standalone server,
the ``s3test`` extra), and the environment a user would set for it; a small real disk."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def s3():  # type: ignore[no-untyped-def]
    """A running S3 server, its endpoint in the environment; yields a pyarrow S3 FileSystem on it."""
    moto_server = pytest.importorskip("moto.server", reason="the S3 test server is the `s3test` extra (moto[server])")
    import pyarrow.fs as pafs

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "test-key-id",
           "AWS_SECRET_ACCESS_KEY": "test-secret-do-not-print", "AWS_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    fs = pafs.S3FileSystem(endpoint_override=env["AWS_ENDPOINT_URL"], scheme="http", region="us-east-1",
                           allow_bucket_creation=True)
    fs.create_dir("models")
    try:
        yield fs
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()



@pytest.fixture
def small_fs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real tmpfs of 300 KiB (root only; skipped with the reason elsewhere)."""
    mount = tmp_path / "fs"
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mount)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)
