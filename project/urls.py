from django.contrib import admin
from django.urls import include, path
from django.views.generic import TemplateView

admin.site.site_header = "emq-django demo"
admin.site.site_title = "emq-django demo"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("emq/", include("emq_django.results.urls")),
    path("", TemplateView.as_view(template_name="index.html"), name="index"),
]
