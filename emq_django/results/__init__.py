"""Job results and history, the admin dashboard and the Prometheus endpoint.

Add ``"emq_django.results"`` to ``INSTALLED_APPS`` and set
``EMQ_RECORDER = "emq_django.results.recorder.DatabaseRecorder"``.
"""
