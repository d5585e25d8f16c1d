"""Analytics: the broker's trace log turned into throughput, latency and failure figures.

The Django app (label ``emq_analytics``) holds the metric models and the admin
page; ``transforms`` holds pure DataFrame -> DataFrame functions; ``io`` reads the
trace and writes Parquet; ``pipeline`` runs them incrementally (``checkpoint``)
and upserts into the models. Only ``transforms``, ``io``, ``session`` and
``pipeline`` import PySpark (the ``emq-django[analytics]`` extra).
"""

INSTALL_HINT = "pip install 'emq-django[analytics]'  (PySpark; it also needs Java 17 or newer)"
