from django.apps import AppConfig


class EmqTasksConfig(AppConfig):
    """``emq_django.backends`` in INSTALLED_APPS: the ``TaskState`` table through which
    the Django Tasks backend reports READY and RUNNING (finished jobs are in
    ``emq_results``)."""

    name = "emq_django.backends"
    label = "emq_tasks"
    verbose_name = "emq Django tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from emq_django import checks  # noqa: F401  (also names a missing emq_django app)
