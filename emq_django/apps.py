from django.apps import AppConfig


class EmqDjangoConfig(AppConfig):
    name = "emq_django"
    verbose_name = "emq"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from emq_django import (
            checks,  # registers system checks
            conf,
            registry,
        )
        from emq_django.backends.discovery import register_django_tasks
        from emq_django.scheduler.api import declared
        from emq_django.security.keys import check_keys

        # a bad CURVE key or key file is an error when the settings are read, not at
        # the first socket
        conf.add_validator(check_keys)
        # checks.py names a missing scheduler app when tasks declare @emq.periodic
        checks.add_periodic_probe(declared)
        # Django Tasks API tasks declared on an EmqTaskBackend run on job managers too
        registry.add_discoverer(register_django_tasks)
