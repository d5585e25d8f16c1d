"""``manage.py emq_keys generate|add|list|revoke|enable``: the broker's allow-list.

- ``generate NAME --roles client,worker [--dir DIR]``: a new key pair in ``DIR``
  (``NAME.key``, ``NAME.key_secret`` with mode 0600), its public key registered;
  ``--server`` writes the broker's own pair and registers nothing;
- ``add NAME PUBLIC_KEY --roles ...``: register a public key made elsewhere;
- ``list``; ``revoke NAME``; ``enable NAME``.

The broker picks changes up within ``EMQ_KEYS_RELOAD`` seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError

from emq_django.security.keyfiles import write_key_pair
from emq_django.security.keys import is_z85_key
from emq_django.security.roles import ROLES, parse_roles

DEFAULT_DIR = "var/keys"


class Command(BaseCommand):
    help = "Generate, register, list and revoke the CURVE keys the broker admits."

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        gen = sub.add_parser("generate", help="a new key pair, its public key registered")
        gen.add_argument("name")
        gen.add_argument("--roles", default="", help=f"comma-separated: {', '.join(ROLES)}")
        gen.add_argument("--dir", default=DEFAULT_DIR, help=f"where (default {DEFAULT_DIR})")
        gen.add_argument(
            "--server", action="store_true", help="the broker's own pair: register nothing"
        )
        add = sub.add_parser("add", help="register a public key made elsewhere")
        add.add_argument("name")
        add.add_argument(
            "public_key",
            help="Z85, 40 characters; one starting with '-' goes last, after '--' "
            "(add NAME --roles R -- KEY)",
        )
        add.add_argument("--roles", required=True)
        sub.add_parser("list", help="every registered key")
        for action in ("revoke", "enable"):
            sub.add_parser(action, help=f"{action} a key").add_argument("name")

    def handle(self, *args: Any, **opts: Any) -> None:
        getattr(self, f"_{opts['action']}")(opts)

    def _roles(self, text: str) -> str:
        try:
            roles = parse_roles(text)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if not roles:
            raise CommandError(f"give --roles (comma-separated: {', '.join(ROLES)})")
        return ",".join(roles)

    def _register(self, name: str, public_key: str, roles: str) -> None:
        from emq_django.security.models import AuthorizedKey

        try:
            AuthorizedKey.objects.create(name=name, public_key=public_key, roles=roles)
        except IntegrityError as exc:
            raise CommandError(f"a key named {name!r} or with that public key exists") from exc

    def _generate(self, opts: dict[str, Any]) -> None:
        name: str = opts["name"]
        roles = "" if opts["server"] else self._roles(opts["roles"])
        if not opts["server"]:
            from emq_django.security.models import AuthorizedKey

            if AuthorizedKey.objects.filter(name=name).exists():
                raise CommandError(f"a key named {name!r} exists")
        try:
            public, public_path, secret_path = write_key_pair(Path(opts["dir"]), name)
        except (FileExistsError, OSError) as exc:
            raise CommandError(str(exc)) from exc
        if not opts["server"]:
            self._register(name, public, roles)
        self.stdout.write(f"public key {public}")
        self.stdout.write(f"wrote {public_path} and {secret_path} (mode 0600)")
        if opts["server"]:
            self.stdout.write(
                f"broker: EMQ_CURVE_SECRET_KEY={secret_path}; everyone else: "
                f"EMQ_CURVE_SERVER_KEY={public_path}"
            )
        else:
            self.stdout.write(f"registered {name!r} with roles {roles}")

    def _add(self, opts: dict[str, Any]) -> None:
        key = opts["public_key"].strip()
        if not is_z85_key(key):
            raise CommandError("PUBLIC_KEY must be 40 characters of Z85")
        roles = self._roles(opts["roles"])
        self._register(opts["name"], key, roles)
        self.stdout.write(f"registered {opts['name']!r} with roles {roles}")

    def _list(self, opts: dict[str, Any]) -> None:
        from emq_django.security.models import AuthorizedKey

        for key in AuthorizedKey.objects.all():
            state = "enabled" if key.enabled else "REVOKED"
            seen = key.last_seen.isoformat(timespec="seconds") if key.last_seen else "never"
            self.stdout.write(
                f"{key.name}  {key.public_key}  roles={key.roles}  {state}  last seen {seen}"
            )

    def _set_enabled(self, name: str, enabled: bool) -> None:
        from emq_django.security.models import AuthorizedKey

        if not AuthorizedKey.objects.filter(name=name).update(enabled=enabled):
            raise CommandError(f"no key named {name!r}")
        word = "enabled" if enabled else "revoked (the broker drops it at its next reload)"
        self.stdout.write(f"{name}: {word}")

    def _revoke(self, opts: dict[str, Any]) -> None:
        self._set_enabled(opts["name"], False)

    def _enable(self, opts: dict[str, Any]) -> None:
        self._set_enabled(opts["name"], True)
