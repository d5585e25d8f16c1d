"""Every ``EMQ_*`` setting with its default and meaning: the docs' settings table.

``settings_reference()`` is the one list the docs site renders
(``docs/reference/settings.md``, through ``docs/hooks.py``), generated from the
settings registry (``settings_registry.EmqSettings``), where each setting is declared
once with its default, meaning and section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from emq_django.conf import default_of, setting_fields


@dataclass(frozen=True, slots=True)
class SettingDoc:
    name: str  # EMQ_...
    default: str  # as the docs show it
    doc: str  # Markdown
    section: str = ""  # the registry's section: client, broker, ports, ...


def _shown(value: Any) -> str:
    if value in ("", (), {}):
        return "empty"
    return str(value)


def settings_reference() -> list[SettingDoc]:
    """Every setting, in the order the registry declares them: (name, default, doc)."""
    return [
        SettingDoc(
            f"EMQ_{f.name}",
            f.metadata["shown"] or _shown(default_of(f)),
            f.metadata["doc"],
            f.metadata["section"],
        )
        for f in setting_fields()
    ]
