from django.apps import AppConfig


class AnalyticsConfig(AppConfig):
    name = "emq_django.analytics"
    label = "emq_analytics"
    verbose_name = "emq analytics"
    default_auto_field = "django.db.models.BigAutoField"
