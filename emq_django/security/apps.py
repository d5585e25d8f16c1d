from django.apps import AppConfig


class SecurityConfig(AppConfig):
    name = "emq_django.security"
    label = "emq_security"
    verbose_name = "emq security"
    default_auto_field = "django.db.models.BigAutoField"
