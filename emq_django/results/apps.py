from django.apps import AppConfig


class EmqResultsConfig(AppConfig):
    name = "emq_django.results"
    label = "emq_results"
    verbose_name = "emq results"
    default_auto_field = "django.db.models.BigAutoField"
