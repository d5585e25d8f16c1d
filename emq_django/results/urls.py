"""``path("emq/", include("emq_django.results.urls"))``: the Prometheus endpoint.

The dashboard itself is an admin page (``/admin/emq_results/dashboard/``).

Nothing here imports the results models: a project that dropped
``emq_django.results`` from INSTALLED_APPS but kept this include still loads its
URLconf, so ``manage.py check`` can say what is missing (emq.E003) instead of
failing on the import.
"""

from django.http import HttpRequest, HttpResponse
from django.urls import path


def metrics(request: HttpRequest) -> HttpResponse:
    from emq_django.results.metrics import metrics_view

    return metrics_view(request)


app_name = "emq_results"
urlpatterns = [
    path("metrics", metrics, name="metrics"),
]
