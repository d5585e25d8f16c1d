"""``AuthorizedKey``: a CURVE public key the broker admits, its name and roles.

The broker reads the enabled ones every ``EMQ_KEYS_RELOAD`` seconds (never on its
hot path); disabling a key (``enabled=False``, the admin or ``emq_keys revoke``)
cuts its connections off at the next reload.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from emq_django.security.keys import Z85_KEY_LENGTH, is_z85_key
from emq_django.security.roles import parse_roles


def _validate_key(value: str) -> None:
    if not is_z85_key(value):
        raise ValidationError("a CURVE public key is 40 characters of Z85")


def _validate_roles(value: str) -> None:
    try:
        parse_roles(value)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


class AuthorizedKey(models.Model):
    name = models.CharField(
        max_length=100, unique=True, help_text="the User-Id the broker logs and checks"
    )
    public_key = models.CharField(
        max_length=Z85_KEY_LENGTH, unique=True, validators=[_validate_key], help_text="Z85"
    )
    roles = models.CharField(
        max_length=200,
        validators=[_validate_roles],
        help_text="comma-separated: client, worker, scheduler, monitor, admin, "
        "publisher, subscriber",
    )
    enabled = models.BooleanField(default=True)
    created = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "authorized key"

    def __str__(self) -> str:
        return f"{self.name} ({self.roles})"

    def role_set(self) -> frozenset[str]:
        return frozenset(parse_roles(self.roles))
