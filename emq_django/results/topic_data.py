"""An event's payload as the Topics page shows it: decoded by its content type.

MessagePack and JSON become compact JSON text (a line per event on the page);
UTF-8 text, and a MessagePack string (how ``emq.publish`` carries text), stays
text; anything else is shown as hex. A payload that does not
decode as its content type says so instead of failing the page (a publisher may
mislabel what it sends).
"""

from __future__ import annotations

import json
from typing import Any

import msgpack

MAX_SHOWN = 4096  # characters of one event's decoded data on the page
MSGPACK = "application/msgpack"
JSON = "application/json"


def _jsonable(value: Any) -> Any:
    """MessagePack can carry what JSON cannot (bytes, non-string keys)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + value.hex()
    if isinstance(value, dict):
        return {str(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _shown(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + f"… ({len(text):,} characters)"


def decode(data: bytes, content_type: str) -> dict[str, str]:
    """``{"as": "msgpack"|"json"|"text"|"hex", "text": ..., "note": ...}``."""
    kind = content_type.split(";")[0].strip().lower()
    note = ""
    if kind in (MSGPACK, "application/x-msgpack"):
        try:
            value = msgpack.unpackb(data, raw=False, strict_map_key=False)
            if isinstance(value, str):  # text (emq.publish of text/...): as it is
                return {"as": "text", "text": _shown(value), "note": ""}
            return {
                "as": "msgpack",
                "text": _shown(json.dumps(_jsonable(value), ensure_ascii=False)),
                "note": "",
            }
        except Exception as exc:  # noqa: BLE001  (any malformed payload: say so, show it raw)
            note = f"not MessagePack ({type(exc).__name__})"
    elif kind == JSON or kind.endswith("+json"):
        try:
            value = json.loads(data)
            text = json.dumps(value, ensure_ascii=False)
            return {"as": "json", "text": _shown(text), "note": ""}
        except ValueError as exc:
            note = f"not JSON ({type(exc).__name__})"
    try:
        text = data.decode("utf-8")
        if text.isprintable() or all(c.isprintable() or c in "\r\n\t" for c in text):
            return {"as": "text", "text": _shown(text), "note": note}
    except UnicodeDecodeError:
        pass
    return {"as": "hex", "text": _shown(data.hex(" ")), "note": note}
