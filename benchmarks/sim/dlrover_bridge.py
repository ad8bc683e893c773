"""The simulator's side of DLRover: a long-lived ``dlrover_worker.py`` in DLRover's own venv.

``dlrover==0.6.1`` pins nothing that clashes with us, but it drags grpcio/protobuf/psutil/pynvml
and its import patches logging; it lives in its own venv, created on demand::

    dlrover-rm simulate --setup-dlrover ...        # or: make dlrover-venv
    python -m venv .venv-dlrover && .venv-dlrover/bin/pip install dlrover==0.6.1 grpcio==1.85.3 protobuf==7.36.2

(~15 s with a warm pip cache, ~60 MB). The venv is found at ``$AIRFLOW_DLROVER_DLROVER_VENV``, else
``./.venv-dlrover``. Requests are batched: a policy sends every stats report of a control period
with its plan request in one line, so one round trip per decision.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DLROVER_REQUIREMENTS = ("dlrover==0.6.1", "grpcio==1.85.3", "protobuf==7.36.2")
WORKER = Path(__file__).with_name("dlrover_worker.py")


class DLRoverUnavailable(RuntimeError):
    """DLRover's venv is missing or broken; the message says how to create it."""


def default_venv() -> Path:
    return Path(os.environ.get("AIRFLOW_DLROVER_DLROVER_VENV", ".venv-dlrover")).absolute()


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def setup_command(venv: Path) -> str:
    return (f"{sys.executable} -m venv {venv} && {venv_python(venv)} -m pip install "
            + " ".join(DLROVER_REQUIREMENTS) + "   (or: python benchmarks/simulate.py --setup-dlrover ...)")


def ensure_venv(venv: Path | None = None, *, create: bool = False) -> Path:
    """Return the venv's python; create the venv when ``create`` (pip needs the network/cache)."""
    venv = Path(venv) if venv else default_venv()
    python = venv_python(venv)
    if not python.exists():
        if not create:
            raise DLRoverUnavailable(
                f"policy 'dlrover' needs dlrover==0.6.1 in its own venv, not found at {venv}. Create it with:\n  "
                + setup_command(venv)
            )
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *DLROVER_REQUIREMENTS], check=True)
    return python


class DLRoverBridge:
    """One worker process; ``call`` sends a batch of requests and returns the replies."""

    def __init__(self, venv: Path | None = None, *, create: bool = False):
        python = ensure_venv(venv, create=create)
        self._process = subprocess.Popen(
            [str(python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, bufsize=1,
        )
        self.calls = 0
        try:
            self.version = self.call([{"op": "version"}])[0]["version"]
        except DLRoverUnavailable:
            self.close()
            raise DLRoverUnavailable(
                f"the dlrover venv at {venv or default_venv()} cannot import DLRover's optimizer; recreate it:\n  "
                + setup_command(Path(venv) if venv else default_venv())
            ) from None

    def call(self, requests: list[dict]) -> list[dict]:
        self.calls += 1
        try:
            self._process.stdin.write(json.dumps(requests) + "\n")
            self._process.stdin.flush()
            line = self._process.stdout.readline()
        except (BrokenPipeError, OSError) as err:
            raise DLRoverUnavailable(f"the DLRover worker died: {err}") from None
        if not line:
            raise DLRoverUnavailable("the DLRover worker exited (is dlrover==0.6.1 importable in its venv?)")
        replies = json.loads(line)
        for request, reply in zip(requests, replies):
            if not reply.get("ok"):
                raise RuntimeError(f"DLRover failed on {request.get('op')} for job {request.get('job')}: {reply.get('error')}")
        return replies

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover
                self._process.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
