"""The export's move on a filesystem that is not local, without an S3 server: fsspec's in-memory
filesystem takes the same path as an object store (copies, the manifest last; deletes, the manifest
first). The S3 API itself: ``test_s3.py``."""

from __future__ import annotations

import json
import uuid

import fsspec
import pytest
from export_process import TABLES, main

from airflow_dlrover.runtime.export import load_export

pytestmark = pytest.mark.unit


def test_an_export_to_memory_replaces_the_old_one_and_leaves_only_itself(tmp_path, capsys):
    root = f"/exports-{uuid.uuid4().hex[:8]}"
    url = f"memory://{root}/ctr"
    main(url, "old", 1.0, str(tmp_path / "old"))
    main(url, "new", 2.0, str(tmp_path / "new"))
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [
        {"export": url, "heartbeats": TABLES}] * 2
    exported = load_export(url)
    assert exported.manifest["job_id"] == "new"
    assert all((rows == 2.0).all() for _, rows in exported.tables)
    fs = fsspec.filesystem("memory")
    assert fs.find(root) == [f"{root}/ctr/{name}" for name in
                             ["dense.pt", "manifest.json"] + [f"tables/{t}.npz" for t in range(TABLES)]]
    assert fs.ls(root, detail=False) == [f"{root}/ctr"]  # no staging or replaced folder left, empty or not
    fs.rm(root, recursive=True)
