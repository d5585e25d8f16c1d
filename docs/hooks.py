"""MkDocs hooks: the reference pages generated from the code.

- ``<!-- generated: settings -->`` becomes the settings table, from
  ``emq_django.settings_reference.settings_reference()``;
- ``<!-- generated: commands -->`` becomes each management command's ``--help``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _setup_django() -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()


def settings_table() -> str:
    from emq_django.settings_reference import settings_reference

    rows = ["| Setting | Default | Meaning |", "|---|---|---|"]
    for s in settings_reference():
        rows.append(f"| `{s.name}` | `{s.default}` | {s.doc} |")
    return "\n".join(rows)


def emq_commands() -> list[tuple[str, str]]:
    """(app, command) for every ``emq_*`` management command in the package."""
    found = []
    for commands in sorted((REPO / "emq_django").glob("**/management/commands")):
        package = commands.parent.parent.relative_to(REPO)
        app = ".".join(package.parts)
        found += [(app, path.stem) for path in sorted(commands.glob("emq_*.py"))]
    return found


def commands_reference() -> str:
    from django.core.management import load_command_class

    parts = []
    for app, name in emq_commands():
        command = load_command_class(app, name)
        usage = command.create_parser("manage.py", name).format_help()
        parts.append(f"## {name}\n\n```text\n{usage.rstrip()}\n```\n")
    return "\n".join(parts)


GENERATED = {
    "<!-- generated: settings -->": settings_table,
    "<!-- generated: commands -->": commands_reference,
}


def on_config(config: Any) -> Any:
    _setup_django()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for marker, render in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
