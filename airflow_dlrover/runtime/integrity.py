"""Checksums that let a reader tell damaged bytes from good ones.

A JSON record the job writes and later trusts (a journal line, the master's state, a checkpoint's
manifest) is *sealed*: written as one JSON object whose last member is ``"crc"``, the CRC-32 of the
object's JSON text without it,

    {"e": "apply", "b": 0, ...}   →   {"e": "apply", "b": 0, ..., "crc": "1a2b3c4d"}

so the line stays JSON for any reader, and :func:`unseal` checks it on the raw text (no
re-serialisation). CRC-32 is enough against bit rot and torn writes; an attacker who can write the
job's folder holds its key anyway. A checkpoint file (tens of MB) is checked by its SHA-256,
recorded in the checkpoint's manifest (:func:`sha256_file`).
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from pathlib import Path
from typing import Any

SEAL = "crc"
_SEALED = re.compile(r'(\{.*), "crc": "([0-9a-f]{8})"\}', re.DOTALL)
_CHUNK = 1 << 20


class Damaged(ValueError):
    """A record or file whose bytes are not the ones written."""


def _crc(payload: str) -> str:
    return f"{zlib.crc32(payload.encode()):08x}"


def seal(record: dict[str, Any]) -> str:
    """``record`` as one line of JSON with its checksum as the last member (see the module
    docstring); ``record`` is a non-empty mapping."""
    if not record or SEAL in record:
        raise ValueError(f"a sealed record is a non-empty mapping without a {SEAL!r} member")
    payload = json.dumps(record)
    return f'{payload[:-1]}, "{SEAL}": "{_crc(payload)}"}}'


def is_sealed(text: str) -> bool:
    """Whether ``text`` carries a seal (whether or not it matches)."""
    return _SEALED.fullmatch(text) is not None


def unseal(text: str, *, required: bool = True) -> dict[str, Any]:
    """The record of a sealed line; raises :class:`Damaged` when it is not JSON, its checksum does
    not match, or (``required``) it carries no seal. ``required=False`` reads a record an older
    writer wrote without one."""
    match = _SEALED.fullmatch(text)
    if match is not None:
        payload = f"{match[1]}}}"
        if _crc(payload) != match[2]:
            raise Damaged("checksum does not match the record")
        text = payload
    elif required:
        raise Damaged(f"no {SEAL!r} checksum")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise Damaged(f"not JSON: {err}") from None
    if not isinstance(record, dict) or SEAL in record:  # a seal whose digits were damaged
        raise Damaged("not a sealed JSON object")
    return record


def sha256_file(path: str | Path) -> str:
    """The SHA-256 (hex) of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
