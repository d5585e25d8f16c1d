"""``path("emq/", include("emq_django.results.urls"))``: the Prometheus endpoint.

The dashboard itself is an admin page (``/admin/emq_results/dashboard/``).
"""

from django.urls import path

from emq_django.results.metrics import metrics_view

app_name = "emq_results"
urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
]
