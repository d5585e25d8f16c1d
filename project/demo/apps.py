from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "project.demo"
    label = "demo"
    verbose_name = "emq-django demo"

    def ready(self) -> None:
        # Registers the sample tasks in every process (web, producer, job manager).
        from project.demo import tasks  # noqa: F401
