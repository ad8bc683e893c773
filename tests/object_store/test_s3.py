"""Datasets and exports on an S3 API (moto's S3 server, ``conftest.py``), through the same fsspec
code as local paths: a job that reads its Parquet from a bucket and exports there, and an export
killed while it writes."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("moto.server", reason="moto[server] runs the S3 API of these tests")
pytest.importorskip("s3fs", reason="s3fs is fsspec's s3:// filesystem")

from airflow_dlrover.cli import main  # noqa: E402
from airflow_dlrover.launchers.local import LocalLauncher  # noqa: E402
from airflow_dlrover.optimizer.types import InvalidInputError  # noqa: E402
from airflow_dlrover.runtime.datasets import TabularSource, write_synthetic  # noqa: E402
from airflow_dlrover.runtime.evaluate import metrics  # noqa: E402
from airflow_dlrover.runtime.export import load_export  # noqa: E402
from export_process import IDS, TABLES  # noqa: E402

pytestmark = pytest.mark.jobs


def test_a_job_reads_parquet_from_a_bucket_and_exports_its_model_there(tmp_path, s3, capsys):
    day, export = s3.url("day"), s3.url("models/ctr")
    write_synthetic(day, 50_000, files=2, row_group_rows=[9000, 4000], table_sizes=(2000,) * 26)
    layout = {"label": "label", "dense": [f"I{j + 1}" for j in range(13)],
              "sparse": [{"name": f"C{t + 1}", "table_size": 2000, "dim": 8} for t in range(26)]}
    (tmp_path / "layout.json").write_text(json.dumps(layout))
    out = tmp_path / "run"
    assert main(["train", "--workers", "1", "--ps", "1", "--data", day, "--layout", str(tmp_path / "layout.json"),
                 "--export", export, "--eval-files", "1", "--job-id", "s3", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out.split("\nwrote")[0])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples_expected"] == summary["samples_trained"] == 25_000 and summary["samples_lost"] == 0
    assert summary["bad_rows"] == 0 and summary["eval_samples"] == 25_000  # the second file, held out
    assert printed["export"] == summary["export"] == export
    spec = LocalLauncher(out / "jobs").spec("s3")
    assert list(spec.dataset.files) == [f"{day}/part-00000.parquet", f"{day}/part-00001.parquet"]

    exported = load_export(export)
    manifest = exported.manifest
    assert manifest["job_id"] == "s3" and manifest["data"] == day
    assert manifest["samples_trained"] == summary["samples_trained"]
    assert manifest["metrics"] == {"loss": summary["eval_loss"], "auc": summary["eval_auc"],
                                   "samples": summary["eval_samples"]}
    assert [(t["name"], t["dim"]) for t in manifest["tables"]] == [(f"C{t + 1}", 8) for t in range(26)]
    held_out = TabularSource(spec.dataset, spec.layout).samples(*spec.held_out)  # read from the bucket
    again = metrics(held_out.label, exported.logits(held_out))
    assert again["auc"] == pytest.approx(summary["eval_auc"], abs=1e-5)
    assert again["loss"] == pytest.approx(summary["eval_loss"], abs=1e-5)
    fs, folder = s3.fs(), f"{s3.bucket}/models/ctr"
    assert fs.ls(f"{s3.bucket}/models", detail=False) == [folder]  # no staging folder left
    assert _files(fs, folder) == ["dense.pt", "manifest.json"] + sorted(f"tables/{t}.npz" for t in range(26))


# -- an export killed while it writes; an export that replaces another ------------------------

HELPER = Path(__file__).with_name("export_process.py")


def _export(url: str, job_id: str, value: float, workdir: Path, die_at: int = 0) -> subprocess.CompletedProcess:
    """``export_process.py`` in a process of its own (it inherits the environment that reaches S3)."""
    return subprocess.run([sys.executable, str(HELPER), url, job_id, str(value), str(workdir / job_id), str(die_at)],
                          capture_output=True, text=True, timeout=120)


def _holds(exported, value: float) -> bool:
    """Whether every stored row and every dense parameter of ``exported`` is ``value``, with the ids
    the helper's two PS stored, sorted: an export written whole by one process."""
    tables = all(np.array_equal(ids, np.sort(IDS[t])) and np.all(rows == value)
                 for t, (ids, rows) in enumerate(exported.tables))
    return tables and all(bool(torch.all(p == value)) for p in exported.model.parameters())


def _files(fs, folder: str) -> list[str]:
    return sorted(p.removeprefix(f"{folder}/") for p in fs.find(folder))


def test_an_export_killed_before_its_manifest_leaves_none_and_the_next_one_succeeds(tmp_path, s3):
    url, folder = s3.url("models/ctr"), f"{s3.bucket}/models/ctr"
    killed = _export(url, "killed", 1.0, tmp_path, die_at=TABLES)  # the last table's heartbeat
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    fs = s3.fs()
    assert not fs.exists(folder) and not fs.exists(f"{folder}/manifest.json")  # nothing at the URL
    [staging] = fs.ls(f"{s3.bucket}/models", detail=False)
    assert re.fullmatch(rf"{folder}\.staging-[0-9a-f]{{8}}", staging)
    assert _files(fs, staging) == ["dense.pt"] + [f"tables/{t}.npz" for t in range(TABLES)]  # no manifest
    for where in (url, f"s3://{staging}"):
        with pytest.raises(InvalidInputError) as refused:
            load_export(where)
        assert str(refused.value) == (f"export={where!r} is invalid: allowed a complete export (a folder with "
                                      "manifest.json)")

    again = _export(url, "again", 2.0, tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"export": url, "heartbeats": TABLES}
    exported = load_export(url)
    assert exported.manifest["job_id"] == "again" and exported.manifest["metrics"] == {
        "loss": 0.5, "auc": 0.75, "samples": 100}
    assert _holds(exported, 2.0)
    fs = s3.fs()
    assert _files(fs, folder) == ["dense.pt", "manifest.json"] + [f"tables/{t}.npz" for t in range(TABLES)]
    # the killed export's staging folder stays where it was: nothing reads it, nothing deletes it
    assert sorted(fs.ls(f"{s3.bucket}/models", detail=False)) == [folder, staging]


@contextlib.contextmanager
def _after_every_write(server, look):
    """Calls ``look()`` after the server has applied each request that writes (PUT, POST, DELETE),
    before the client gets its answer, one write at a time: a write waits while ``look`` reads the
    bucket (through the server's other threads), and concurrent writes (s3fs copies a list of files
    at once) are applied one by one, each seen. Wraps the WSGI app of moto's server (werkzeug's
    ``server.app``)."""
    app = server._server.app
    one_write = threading.Lock()

    def observed(environ, start_response):
        if environ["REQUEST_METHOD"] not in ("PUT", "POST", "DELETE"):
            return app(environ, start_response)
        with one_write:
            body = b"".join(app(environ, start_response))
            look()
        return [body]

    server._server.app = observed
    try:
        yield
    finally:
        server._server.app = app


def test_an_export_that_replaces_another_shows_the_old_then_none_then_the_new(tmp_path, s3):
    url, folder = s3.url("models/ctr"), f"{s3.bucket}/models/ctr"
    assert _export(url, "old", 1.0, tmp_path).returncode == 0
    seen: list[str] = []

    def job_at(where: str) -> str:
        """The job whose export a reader of ``where`` loads, ``refused``, or ``broken: ...``."""
        try:
            exported = load_export(where)
        except InvalidInputError:
            return "refused"
        except Exception as err:  # noqa: BLE001 - a manifest whose files are missing: what must not happen
            return f"broken: {err!r}"
        job = exported.manifest["job_id"]
        return job if _holds(exported, {"old": 1.0, "new": 2.0}[job]) else f"{job}, mixed"

    def look():
        """What a reader of the URL gets now; when it is refused, whether the old export is
        complete beside it (``<url>.replaced-…``)."""
        fs = s3.fs()
        now = job_at(url)
        if now == "refused":
            beside = [job_at(f"s3://{p}") for p in fs.ls(f"{s3.bucket}/models", detail=False) if ".replaced-" in p]
            now = "refused, the old one beside" if beside == ["old"] else f"refused, beside: {beside}"
        seen.append(now)

    with _after_every_write(s3.server, look):
        replaced = _export(url, "new", 2.0, tmp_path)
    assert replaced.returncode == 0, replaced.stderr
    assert [state for state, _ in itertools.groupby(seen)] == ["old", "refused, the old one beside", "new"]
    # s3fs's requests (one per file, one per recursive delete): the staging folder's 5 files written and
    # the old export's 5 copied aside; the old manifest deleted, then the rest, and the new export's 4
    # other files copied; its manifest copied, the staging manifest deleted, the rest, the old one aside
    assert seen == ["old"] * 10 + ["refused, the old one beside"] * 6 + ["new"] * 4
    fs = s3.fs()
    assert fs.ls(f"{s3.bucket}/models", detail=False) == [folder]  # staging and the old one gone
    assert load_export(url).manifest["job_id"] == "new"
