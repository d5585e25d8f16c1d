from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "emq_django.scheduler"
    label = "emq_scheduler"
    verbose_name = "emq scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from emq_django import checks  # noqa: F401  (also names a missing emq_django app)
