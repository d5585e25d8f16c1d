"""System checks: bad EMQ_* settings show up in ``manage.py check``."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, register
from django.core.exceptions import ImproperlyConfigured


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    from emq_django.conf import get_settings

    try:
        get_settings()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="emq.E001")]
    return []
