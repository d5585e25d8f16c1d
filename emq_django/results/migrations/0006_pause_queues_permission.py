from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("emq_results", "0005_permissions"),
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
                ],
                "verbose_name": "dashboard",
                "verbose_name_plural": "dashboard",
            },
        ),
    ]
