"""Short previews of a job's arguments and result in the admin's job list (issue
35): only the first ``HEAD`` characters are read from the database (``Substr``,
the full columns stay deferred), and the arguments are masked as the job page
masks them unless ``EMQ_RESULTS_SHOW_ARGS``."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.db.models.functions import Substr
from django.utils.html import format_html
from django.utils.safestring import SafeString

from emq_django.results.conf import results_settings

HEAD = 120  # characters read per column
SHOWN = 24  # characters shown of each (all of HEAD in its tooltip)
MASKED = "••••"
MASKED_TITLE = "masked: set EMQ_RESULTS_SHOW_ARGS=true to show"


def annotate(qs: QuerySet[Any]) -> QuerySet[Any]:
    qs = qs.annotate(result_head=Substr("result", 1, HEAD))
    if results_settings().show_args:
        qs = qs.annotate(args_head=Substr("args", 1, HEAD), kwargs_head=Substr("kwargs", 1, HEAD))
    return qs


def _short(text: str, full: bool) -> SafeString:
    shown = text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"
    title = text + ("…" if not full else "")
    return format_html('<code class="emq-preview" title="{}">{}</code>', title, shown)


def arguments(obj: Any) -> SafeString:
    args = getattr(obj, "args_head", None)
    if args is None:
        return format_html('<span title="{}">{}</span>', MASKED_TITLE, MASKED)
    kwargs = getattr(obj, "kwargs_head", None) or ""
    text = args + (" " + kwargs if kwargs not in ("", "{}") else "")
    return _short(text, len(args) < HEAD and len(kwargs) < HEAD)


def result(obj: Any) -> SafeString | str:
    head = getattr(obj, "result_head", None)
    if not head:
        return "–"
    return _short(head, len(head) < HEAD)
