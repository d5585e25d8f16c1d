"""Writing CURVE key files in ZeroMQ's certificate format (the one
``zmq.auth.load_certificate`` reads, and ``EMQ_CURVE_*`` accept as paths).

The secret file is created with mode 0600 from the start (``O_EXCL``: an existing
file is never overwritten), not chmod-ed after it was written.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import zmq

_TEMPLATE = """#   ****  Generated on {when} by emq_keys  ****
#   ZeroMQ CURVE {what} Certificate
{warning}
metadata
    name = "{name}"
curve
    public-key = "{public}"
{secret}"""


def _write(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def write_key_pair(directory: Path, name: str) -> tuple[str, Path, Path]:
    """A new key pair as ``NAME.key`` (public) and ``NAME.key_secret`` (0600) in
    ``directory``; returns (public key, public file, secret file). Raises
    ``FileExistsError`` rather than overwrite a key."""
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    public_path = directory / f"{name}.key"
    secret_path = directory / f"{name}.key_secret"
    for path in (public_path, secret_path):
        if path.exists():
            raise FileExistsError(f"{path} exists; not overwriting a key")
    common = {"when": when, "name": name, "public": public.decode()}
    _write(
        secret_path,
        _TEMPLATE.format(
            what="**Secret**",
            warning="#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.\n",
            secret=f'    secret-key = "{secret.decode()}"\n',
            **common,
        ),
        0o600,
    )
    _write(public_path, _TEMPLATE.format(what="Public", warning="", secret="", **common), 0o644)
    return public.decode(), public_path, secret_path
