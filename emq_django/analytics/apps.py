from django.apps import AppConfig


class AnalyticsConfig(AppConfig):
    name = "emq_django.analytics"
    label = "emq_analytics"
    verbose_name = "emq analytics"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from emq_django import checks  # noqa: F401  (also names a missing emq_django app)
