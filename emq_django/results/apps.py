from django.apps import AppConfig


class EmqResultsConfig(AppConfig):
    name = "emq_django.results"
    label = "emq_results"
    verbose_name = "emq results"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib import admin

        from emq_django import (
            checks,  # noqa: F401  (also names a missing emq_django app)
            handles,
        )
        from emq_django.admin_index import install
        from emq_django.results.lookup import stored_outcome

        install(admin.site)
        handles.set_history_lookup(
            stored_outcome
        )  # emq.result(id) reads the history  # one "emq" section on the admin index
