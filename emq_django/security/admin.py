"""The admin for ``AuthorizedKey`` (staff only; revoke and enable need the change
permission, not only the view one, issue 29 item 19): add a public
key with its roles, disable one to cut it off at the broker's next reload."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from emq_django.security.models import AuthorizedKey


@admin.register(AuthorizedKey)
class AuthorizedKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "roles", "enabled", "public_key", "created", "last_seen")
    list_filter = ("enabled",)
    search_fields = ("name", "public_key")
    readonly_fields = ("created", "last_seen")
    actions = ("revoke", "enable")

    @admin.action(description="Revoke (disable) the selected keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[AuthorizedKey]) -> None:
        n = queryset.update(enabled=False)
        self.message_user(
            request,
            (
                f"{n} key(s) revoked; the broker drops them at its next reload "
                "(until then they may still receive events)"
            ),
        )

    @admin.action(description="Enable the selected keys", permissions=["change"])
    def enable(self, request: HttpRequest, queryset: QuerySet[AuthorizedKey]) -> None:
        n = queryset.update(enabled=True)
        self.message_user(request, f"{n} key(s) enabled")
