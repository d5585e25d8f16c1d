"""The scheduler: schedules kept in Django models, fired by ``manage.py emq_scheduler``.

Pure arithmetic in ``cron`` and ``timing``; the database side in ``models`` and
``store``; the broker connection in ``peer``; the public API in ``api``.
"""
