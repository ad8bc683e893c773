"""Entry point of one training process: ``python -m airflow_dlrover.runtime ROLE --job-dir DIR ...``."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path

from airflow_dlrover.optimizer.constants import UNREACHABLE_EXIT_CODE, USER_ERROR_EXIT_CODE
from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.runtime.spec import JobSpec
from airflow_dlrover.runtime.transport import Unreachable

#: the file holding the job's key in a pod: its Secret, mounted read-only (launchers/kubernetes_manifests.py)
AUTHKEY_FILE_ENV = "DLROVER_AUTHKEY_FILE"
#: where a node that stops on a user error writes why: a pod's terminationMessagePath; locally
#: ``<job dir>/exit/<node>.message`` (the launcher reads it as the node's exit reason)
TERMINATION_FILE_ENV = "DLROVER_TERMINATION_FILE"
TERMINATION_MESSAGE_CHARS = 4000  # a pod's termination message is cut at 4096 bytes
#: What a node writes (checkpoints, journals, the master's state, metrics) its user alone reads:
#: the trained model and the job's data are not the machine's. (ours)
UMASK = 0o077


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_dlrover.runtime")
    parser.add_argument("role", choices=("master", "ps", "worker"))
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--count", type=int, default=1, help="number of PS (ps role)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (master, ps): loopback locally, 0.0.0.0 in a pod")
    parser.add_argument("--master", default=None, help="host:port of the master (worker role)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (worker role)")
    parser.add_argument("--name", default=None)
    args = parser.parse_args(argv)
    os.umask(UMASK)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.role}-{args.index} %(levelname)s %(message)s")
    spec = JobSpec.load(args.job_dir / "spec.json")
    if os.environ.get(AUTHKEY_FILE_ENV):  # in a pod the key comes from a Secret, not the ConfigMap's spec.json
        spec = dataclasses.replace(spec, authkey=Path(os.environ[AUTHKEY_FILE_ENV]).read_text().strip())
    if not spec.authkey:
        parser.error(f"spec.json has no authkey and ${AUTHKEY_FILE_ENV} is unset: the PS connections need a key")
    ready = args.job_dir / "run" / f"{args.name or args.role}.addr"
    try:
        _run(args, spec, ready)
    except InvalidInputError as err:  # the user's data or model: the launcher fails the job without retry
        logging.getLogger(__name__).error("%s", err)
        termination = Path(os.environ.get(TERMINATION_FILE_ENV) or args.job_dir / "exit" / f"{args.name or args.role}.message")
        termination.parent.mkdir(parents=True, exist_ok=True)
        termination.write_text(str(err)[-TERMINATION_MESSAGE_CHARS:])
        return USER_ERROR_EXIT_CODE
    except Unreachable as err:  # its master or a PS stayed away past the retries: the cluster's failure
        logging.getLogger(__name__).error("%s", err)
        return UNREACHABLE_EXIT_CODE
    return 0


def _run(args: argparse.Namespace, spec: JobSpec, ready: Path) -> None:
    if args.role == "master":
        from airflow_dlrover.runtime.master import serve

        serve(spec, args.job_dir, args.port, ready, host=args.host)
    elif args.role == "ps":
        from airflow_dlrover.runtime.ps import serve

        serve(spec, args.index, args.count, args.port, ready, host=args.host, root=args.job_dir)
    else:
        from airflow_dlrover.runtime.prepare import require_torch

        require_torch()  # a node's image or Python without the extra: a user error, not a retried crash
        from airflow_dlrover.runtime.worker import Worker

        Worker(spec, args.name or f"worker-{args.index}", args.master, args.threads).run()


if __name__ == "__main__":
    sys.exit(main())
