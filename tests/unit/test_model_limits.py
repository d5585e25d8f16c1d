"""What the wire takes, the models can keep: a job id or a queue name the broker
accepts fits the columns that record it (SQLite does not enforce a CharField's
max_length, PostgreSQL and MariaDB do: a longer id failed the whole insert there,
and the history lost the batch's outcomes); and every model change has its
migration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from django.apps import apps
from django.db import models

from emq_django.protocol.limits import MAX_JOB_ID, MAX_NAME_LENGTH

ROOT = Path(__file__).resolve().parents[2]
JOB_ID_FIELDS = {"id", "job_id", "original_id"}


def our_char_fields() -> list[tuple[str, models.CharField]]:
    found = []
    for model in apps.get_models():
        if not model.__module__.startswith("emq_django."):
            continue
        for field in model._meta.get_fields():
            if isinstance(field, models.CharField) and field.model is model:
                found.append((f"{model._meta.label}.{field.name}", field))
    return found


def test_job_id_columns_take_the_longest_job_id() -> None:
    short = {
        name: field.max_length
        for name, field in our_char_fields()
        if field.name in JOB_ID_FIELDS and (field.max_length or 0) < MAX_JOB_ID
    }
    assert not short, f"job ids are up to {MAX_JOB_ID} bytes (MAX_JOB_ID): {short}"


def test_queue_columns_take_the_longest_queue_name() -> None:
    short = {
        name: field.max_length
        for name, field in our_char_fields()
        if field.name == "queue" and (field.max_length or 0) < MAX_NAME_LENGTH
    }
    assert not short, f"queue names are up to {MAX_NAME_LENGTH} bytes: {short}"


def test_every_model_change_has_its_migration() -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
