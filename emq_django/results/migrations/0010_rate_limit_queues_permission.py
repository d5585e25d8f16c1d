from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("emq_results", "0009_resize_job_managers_permission"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="dashboard",
            options={
                "default_permissions": (),
                "managed": False,
                "permissions": [
                    ("requeue_deadletters", "Can requeue the broker's dead letters"),
                    ("purge_deadletters", "Can purge the broker's dead letters (gone for good)"),
                    ("pause_queues", "Can pause and resume the broker's queues"),
                    (
                        "drain_job_managers",
                        "Can drain job managers and give them jobs again",
                    ),
                    (
                        "stop_job_managers",
                        "Can stop job managers (they finish their jobs and exit)",
                    ),
                    (
                        "resize_job_managers",
                        "Can change how many worker processes a job manager runs",
                    ),
                    ("rate_limit_queues", "Can change the rate limits of the broker's queues"),
                ],
                "verbose_name": "dashboard",
                "verbose_name_plural": "dashboard",
            },
        ),
    ]
