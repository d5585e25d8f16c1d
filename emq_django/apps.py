from django.apps import AppConfig


class EmqDjangoConfig(AppConfig):
    name = "emq_django"
    verbose_name = "emq"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from emq_django import checks  # noqa: F401  (registers system checks)
