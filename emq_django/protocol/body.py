"""The JSON ``run`` body that EventMQ clients send in a REQUEST.

``["run", {"callable": "add", "path": "pkg.tasks", "args": [], "kwargs": {},
"class_args": [], "class_kwargs": {}}]``. Arguments travel as JSON, never pickle.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from json.encoder import c_make_encoder  # type: ignore[attr-defined]
from json.encoder import encode_basestring as c_encode_basestring
from typing import Any

from emq_django.exceptions import ProtocolError
from emq_django.protocol.limits import (
    BODY_DEPTH,
    MAX_DEPTH,
    REFUSED_TOO_DEEP,
    may_nest_deeper_than,
    nested_deeper_than,
)

_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_decoder = json.JSONDecoder()  # json.loads' own, without its per-call encoding guess

if c_make_encoder is not None:
    # ``_encoder``'s C encoder, made once: ``JSONEncoder.encode`` makes one per call.
    # Without the circular-reference markers (they would be shared between
    # threads): a cycle raises RecursionError, and callers then go through
    # ``_encoder``, which names the error.
    _iterencode = c_make_encoder(
        None, _encoder.default, c_encode_basestring, None, ":", ",", False, False, False
    )

    def _dumps(value: Any) -> str:
        return "".join(_iterencode(value, 0))

else:  # pragma: no cover - CPython always has the C encoder

    def _dumps(value: Any) -> str:
        return _encoder.encode(value)


# Not frozen: it holds lists and dicts (never hashable), and a frozen dataclass
# costs several µs more to build, once per job in the worker.
@dataclass(slots=True)
class RunBody:
    path: str
    callable: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    class_args: list[Any] = field(default_factory=list)
    class_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def task_name(self) -> str:
        """The registry key: ``path.callable`` (``pkg.mod:Class.method`` for classes)."""
        return f"{self.path}.{self.callable}"


def encode_run_body(path: str, name: str, args: Any = (), kwargs: Any = None) -> bytes:
    """Encode a run body; raises ``TypeError`` for arguments JSON cannot carry,
    and for arguments nested deeper than ``MAX_DEPTH`` (100) lists or dicts."""
    if type(args) is not tuple and type(args) is not list:
        args = _args_list(args, f"{path}.{name}")
    if kwargs and type(kwargs) is not dict:
        _check_kwargs(kwargs, f"{path}.{name}")
    payload = {"callable": name, "path": path, "args": list(args), "kwargs": kwargs or {}}
    try:
        text = _encoder.encode(["run", payload])
    except RecursionError:
        raise TypeError(_too_deep(f"arguments of {path}.{name}")) from None
    except (TypeError, ValueError) as exc:
        raise TypeError(f"arguments of {path}.{name} must be JSON serializable: {exc}") from exc
    # the count is a C loop over the text; the walk only runs when it says maybe
    if may_nest_deeper_than(text, BODY_DEPTH) and nested_deeper_than(payload, MAX_DEPTH + 2):
        raise TypeError(_too_deep(f"arguments of {path}.{name}"))
    return _utf8(text, f"{path}.{name}")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate: JSON cannot carry it either
        raise TypeError(
            f"arguments of {what} must be JSON serializable: a string holds "
            f"{text[exc.start : exc.end]!r}, a lone surrogate, which is not valid Unicode"
        ) from None


def _args_list(args: Any, what: str) -> list[Any]:
    """``args`` as the list it stands for; ``TypeError`` for a str, bytes or mapping
    (``args='abc'`` would send three arguments) or a non-iterable."""
    if isinstance(args, str | bytes | bytearray | Mapping):
        raise TypeError(
            f"args of {what} must be a list or tuple of arguments, got {type(args).__name__} "
            f"{str(args)[:40]!r} (a single argument goes in a tuple: (x,))"
        )
    try:
        return list(args)
    except TypeError:
        raise TypeError(
            f"args of {what} must be a list or tuple of arguments, got {type(args).__name__}"
        ) from None


def _check_kwargs(kwargs: Any, what: str) -> None:
    if not isinstance(kwargs, Mapping):
        raise TypeError(
            f"kwargs of {what} must be a dict of keyword arguments, got {type(kwargs).__name__}"
        )


class RunBodyEncoder:
    """``encode_run_body(path, name, ...)`` for one task, cheaper per call: the
    JSON around the arguments is written once, a call without arguments is one
    constant, and only the arguments go through the encoder. The bytes are the
    same as ``encode_run_body``'s (and raise the same errors)."""

    __slots__ = ("path", "name", "_head", "_empty")

    def __init__(self, path: str, name: str) -> None:
        self.path = path
        self.name = name
        head = _encoder.encode(["run", {"callable": name, "path": path, "args": []}])
        self._head = head[: -len("[]}]")]  # '["run",{"callable":..,"path":..,"args":'
        self._empty = encode_run_body(path, name)

    def encode(self, args: Any = (), kwargs: Any = None) -> bytes:
        if not args and not kwargs:
            return self._empty
        if type(args) is not tuple and type(args) is not list:
            args = _args_list(args, f"{self.path}.{self.name}")
        if kwargs and type(kwargs) is not dict:
            _check_kwargs(kwargs, f"{self.path}.{self.name}")
        try:
            if kwargs:
                text = f'{self._head}{_dumps(args)},"kwargs":{_dumps(kwargs)}}}]'
            else:
                # ints and strings alone (ids, keys: most calls) skip the encoder
                parts = []
                for item in args:
                    if type(item) is int:
                        parts.append(int.__repr__(item))
                    elif type(item) is str:
                        parts.append(c_encode_basestring(item))
                    else:
                        text = f'{self._head}{_dumps(args)},"kwargs":{{}}}}]'
                        break
                else:
                    text = f'{self._head}[{",".join(parts)}],"kwargs":{{}}}}]'
        except Exception:  # the general encoder raises the same error, with its reason
            return encode_run_body(self.path, self.name, args, kwargs)
        if may_nest_deeper_than(text, BODY_DEPTH):
            payload = {"args": list(args), "kwargs": kwargs or {}}
            if nested_deeper_than(payload, MAX_DEPTH + 2):
                raise TypeError(_too_deep(f"arguments of {self.path}.{self.name}"))
        try:
            return text.encode()
        except UnicodeEncodeError:
            return encode_run_body(self.path, self.name, args, kwargs)  # raises, saying why


def _too_deep(what: str) -> str:
    return (
        f"{what} nest lists or dicts more than {MAX_DEPTH} deep; the most is {MAX_DEPTH} "
        "(JSON decoders recurse, and a deeper body would kill the worker)"
    )


def _decode_text(text: str) -> Any:
    """``json.loads(text)`` for a text that starts with ``[``: the decoder's C
    scanner called directly (``JSONDecoder.decode`` adds two regex matches and two
    Python calls per body); the same values and the same errors."""
    try:
        data, end = _scan_once(text, 0)
    except StopIteration as err:
        raise json.JSONDecodeError("Expecting value", text, err.value) from None
    if end != len(text):
        rest = len(text) - len(text[end:].lstrip(_JSON_SPACE))
        if rest != len(text):
            raise json.JSONDecodeError("Extra data", text, rest)
    return data


_scan_once = _decoder.scan_once  # type: ignore[attr-defined]
_JSON_SPACE = " \t\n\r"


def decode_run_body(body: bytes) -> RunBody:
    """Decode a run body; raises ``ProtocolError`` with the reason."""
    try:
        if body[:2] == b'["':  # what every client sends: UTF-8, json.loads' own guess
            data = _decode_text(body.decode("utf-8", "surrogatepass"))
        else:  # anything else as json.loads takes bytes (a UTF-16 body, say)
            data = json.loads(body)
    except RecursionError:
        raise ProtocolError(
            _too_deep("the body's arguments"), [body[:200]], REFUSED_TOO_DEEP
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"body is not JSON: {exc}", [body[:200]]) from None
    if not (isinstance(data, list) and len(data) == 2 and data[0] == "run"):
        raise ProtocolError('body must be ["run", {...}]', [body[:200]])
    spec = data[1]
    if not isinstance(spec, dict):
        raise ProtocolError("run body needs an object", [body[:200]])
    path, name = spec.get("path"), spec.get("callable")
    if not isinstance(path, str) or not isinstance(name, str) or not path or not name:
        raise ProtocolError("run body needs string 'path' and 'callable'", [body[:200]])
    args = spec.get("args") or []
    kwargs = spec.get("kwargs") or {}
    class_args = spec.get("class_args") or []
    class_kwargs = spec.get("class_kwargs") or {}
    if not isinstance(args, list) or not isinstance(class_args, list):
        raise ProtocolError("run body 'args' must be a list", [body[:200]])
    if not isinstance(kwargs, dict) or not isinstance(class_kwargs, dict):
        raise ProtocolError("run body 'kwargs' must be an object", [body[:200]])
    # more than BODY_DEPTH brackets take more bytes than that: a short body is not counted
    if (
        len(body) > BODY_DEPTH
        and may_nest_deeper_than(body, BODY_DEPTH)
        and nested_deeper_than(spec, MAX_DEPTH + 2)
    ):
        raise ProtocolError(_too_deep("the body's arguments"), [body[:200]], REFUSED_TOO_DEEP)
    return RunBody(path, name, args, kwargs, class_args, class_kwargs)


def encode_result(value: Any) -> bytes:
    """A success reply body, as EventMQ's job manager writes it."""
    return _encoder.encode({"value": value}).encode()


def encode_failure(type_name: str, message: str, traceback: str) -> bytes:
    """A failure reply body; the ``error`` key tells it from a success."""
    error = {"type": type_name, "message": message, "traceback": traceback}
    return _encoder.encode({"error": error}).encode()
