"""An S3 API for the tests that need one: moto's S3 server, run in this process's threads
(``moto.server.ThreadedMotoServer``), a fresh bucket per test, and the environment that the test and
the processes of its jobs inherit to reach it through fsspec (s3fs, over aiobotocore).

The endpoint reaches them through ``AWS_ENDPOINT_URL``: botocore resolves a client's endpoint from it
when none is given, and s3fs, given none, gives none. The environment is restored after each test,
and s3fs's cached filesystems (which hold their client, bound to this server) are dropped with it."""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass

import pytest

#: what reaches a client of this server: credentials (moto accepts any), the region; and the endpoint,
#: ``AWS_ENDPOINT_URL``, set by the fixture
ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
#: what could send a client elsewhere, or sign it differently, from the developer's own setup
UNSET = ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
         "FSSPEC_S3", "FSSPEC_S3_ENDPOINT_URL")

_BUCKETS = itertools.count()


@dataclass(frozen=True)
class S3:
    """The server's endpoint and this test's bucket: ``url("day")`` is ``s3://<bucket>/day``."""

    endpoint: str
    bucket: str
    server: object  # the ThreadedMotoServer

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def fs(self):
        """This process's s3fs filesystem, its listings cache emptied (a job's processes write
        behind its back)."""
        import fsspec

        fs = fsspec.filesystem("s3")
        fs.invalidate_cache()
        return fs


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on a free port of 127.0.0.1 (the OS picks it: no race), for the session."""
    from moto.server import ThreadedMotoServer

    werkzeug = logging.getLogger("werkzeug")  # one log line per request otherwise
    level = werkzeug.level
    werkzeug.setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield server, f"http://{host}:{port}"
    server.stop()
    werkzeug.setLevel(level)


@pytest.fixture()
def s3(s3_server, monkeypatch, tmp_path):
    """A new bucket on :func:`s3_server`, and the environment that reaches it (restored after)."""
    import fsspec.config
    import s3fs

    server, endpoint = s3_server
    for name, value in {**ENV, "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(name, value)
    for name in UNSET:
        monkeypatch.delenv(name, raising=False)
    # no ~/.aws of the developer's: its profiles may name another endpoint or credentials
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.delitem(fsspec.config.conf, "s3", raising=False)  # FSSPEC_S3* as read when fsspec was imported
    for name in ("NO_PROXY", "no_proxy"):  # a proxy of the machine's is not asked for 127.0.0.1
        monkeypatch.setenv(name, ",".join(filter(None, [os.environ.get(name), "127.0.0.1"])))
    s3fs.S3FileSystem.clear_instance_cache()
    store = S3(endpoint=endpoint, bucket=f"test-bucket-{next(_BUCKETS)}", server=server)
    store.fs().mkdir(store.bucket)
    yield store
    s3fs.S3FileSystem.clear_instance_cache()
