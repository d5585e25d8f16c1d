"""This process's CURVE keys, read from the settings.

``EMQ_CURVE_SECRET_KEY`` is this process's secret key: 40 characters of Z85, or
the path of a key file as ``zmq.auth.create_certificates`` or ``emq_keys
generate`` write them (the ``.key_secret`` file). ``EMQ_CURVE_PUBLIC_KEY`` is
optional (derived from the secret key when empty; a mismatch is refused).
``EMQ_CURVE_SERVER_KEY`` is the broker's public key (Z85 or a key file), which
every client, job manager, scheduler and monitor client needs. No secret key: the
process speaks plain text, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from django.core.exceptions import ImproperlyConfigured

Z85_KEY_LENGTH = 40
FROM_SETTINGS = "settings"  # a client's keys: read EMQ_CURVE_* when the socket is made


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """A key pair (Z85 bytes), and for a client the server's public key."""

    public: bytes
    secret: bytes
    server: bytes | None = None  # None: this process is the CURVE server
    # how EMQ_CURVE_SERVER_KEY was read (a key file, or the key itself), for errors
    server_from: str = ""

    def __repr__(self) -> str:  # never print a secret key in a log or a traceback
        return f"CurveKeys(public={self.public.decode()!r}, server={self.server!r})"


def is_z85_key(text: str) -> bool:
    if len(text) != Z85_KEY_LENGTH:
        return False
    try:
        zmq.utils.z85.decode(text.encode("ascii"))
    except (ValueError, KeyError, UnicodeEncodeError):
        return False
    return True


def read_key(setting: str, value: str, secret: bool) -> bytes:
    """The Z85 key in ``value`` (the text itself, or a key file's path); raises
    ``ImproperlyConfigured`` saying which setting is wrong."""
    return read_key_from(setting, value, secret)[0]


def read_key_from(setting: str, value: str, secret: bool) -> tuple[bytes, str]:
    """``read_key``, and how the key was taken, for error messages: a file that
    exists is read as a key file (a path of 40 characters can be Z85 too); else 40
    characters of Z85 are the key itself."""
    text = value.strip()
    path = Path(text).expanduser()
    if path.is_file():
        return _read_key_file(setting, path, secret), f"EMQ_{setting} read from the key file {path}"
    if is_z85_key(text):
        return text.encode("ascii"), (
            f"EMQ_{setting} taken as the key itself (40 characters of Z85; no file of that name)"
        )
    raise ImproperlyConfigured(
        f"EMQ_{setting} is neither a readable key file nor a 40-character Z85 key: "
        f"{text[:60]!r} (no such file)"
    )


def _read_key_file(setting: str, path: Path, secret: bool) -> bytes:
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ImproperlyConfigured(f"EMQ_{setting}: cannot read key file {path}: {exc}") from exc
    if secret:
        if not secret_key:
            raise ImproperlyConfigured(
                f"EMQ_{setting}: {path} holds no secret key (use the .key_secret file)"
            )
        return bytes(secret_key)
    return bytes(public)


def _check_curve() -> None:
    if not zmq.has("curve"):
        raise ImproperlyConfigured(
            "EMQ_CURVE_SECRET_KEY is set but this libzmq was built without CURVE "
            "(zmq.has('curve') is False): install pyzmq's wheel or a libzmq with libsodium"
        )


def process_keys(settings: Any) -> CurveKeys | None:
    """This process's keys from ``settings`` (an ``EmqSettings``); None: plain text."""
    if not settings.CURVE_SECRET_KEY:
        return None
    _check_curve()
    secret = read_key("CURVE_SECRET_KEY", settings.CURVE_SECRET_KEY, secret=True)
    public = zmq.curve_public(secret)
    if settings.CURVE_PUBLIC_KEY:
        given = read_key("CURVE_PUBLIC_KEY", settings.CURVE_PUBLIC_KEY, secret=False)
        if given != public:
            raise ImproperlyConfigured(
                "EMQ_CURVE_PUBLIC_KEY is not the public key of EMQ_CURVE_SECRET_KEY "
                "(leave it empty: it is derived)"
            )
    server, server_from = None, ""
    if settings.CURVE_SERVER_KEY:
        server, server_from = read_key_from("CURVE_SERVER_KEY", settings.CURVE_SERVER_KEY, False)
    return CurveKeys(public, secret, server, server_from)


def check_keys(settings: Any) -> None:
    """Raises ``ImproperlyConfigured`` for a bad CURVE key or key file in ``settings``
    (registered with ``conf.add_validator`` by the app's ``ready()``)."""
    if settings.CURVE_SECRET_KEY:
        process_keys(settings)


def server_keys(settings: Any) -> CurveKeys | None:
    """The broker's keys: a CURVE server on every port when it has a secret key."""
    keys = process_keys(settings)
    return None if keys is None else CurveKeys(keys.public, keys.secret, None)


def resolve(curve: CurveKeys | None | str) -> CurveKeys | None:
    """A client's keys: ``curve`` itself, or the settings' for ``FROM_SETTINGS``."""
    return client_keys() if isinstance(curve, str) else curve


def client_keys(settings: Any = None) -> CurveKeys | None:
    """A client's keys (``settings``: the cached settings when None); raises
    ``ImproperlyConfigured`` when a secret key is set without the server's key."""
    if settings is None:
        from emq_django.conf import cached_settings

        settings = cached_settings()
    keys = process_keys(settings)
    if keys is not None and keys.server is None:
        raise ImproperlyConfigured(
            "EMQ_CURVE_SECRET_KEY is set but EMQ_CURVE_SERVER_KEY (the broker's public "
            "key) is not: a client cannot reach a CURVE broker without it"
        )
    return keys
