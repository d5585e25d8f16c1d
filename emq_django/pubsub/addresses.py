"""Where the Event BUS ports are, from the settings (publish, batch, snapshot)."""

from __future__ import annotations

from emq_django.conf import EmqSettings


def _url(settings: EmqSettings, name: str) -> str:
    url: str = getattr(settings, f"BUS_{name}_URL") or getattr(settings, f"BUS_{name}_BIND")
    if not url:
        raise ValueError(f"EMQ_BUS_{name}_URL (or EMQ_BUS_{name}_BIND) is not set")
    return url.replace("://0.0.0.0:", "://127.0.0.1:").replace("://*:", "://127.0.0.1:")


def _live_url(
    settings: EmqSettings, publish_url: str | None, batch_url: str | None
) -> tuple[str, bool]:
    """Where a subscriber reads live events, and whether that is the batch publisher."""
    if batch_url:
        return batch_url, True
    if not publish_url and (settings.BUS_BATCH_URL or settings.BUS_BATCH_BIND):
        return _url(settings, "BATCH"), True
    return publish_url or _url(settings, "PUBLISH"), False
