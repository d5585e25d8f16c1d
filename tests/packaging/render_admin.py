"""Run by the installed wheel's Python in a copy of the example project: GET every
admin page as a staff user; print one line per page, exit 1 if any is not 200."""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from django.contrib import admin  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client, RequestFactory  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402
from django.urls import NoReverseMatch, reverse  # noqa: E402

import emq_django  # noqa: E402

print(f"emq_django from {emq_django.__file__}")
setup_test_environment()  # as the test runner does: testserver is an allowed host
call_command("migrate", verbosity=0)
user = User.objects.create_superuser("admin", "admin@example.com", "admin")
client = Client()
client.force_login(user)
request = RequestFactory().get("/admin/")
request.user = user

urls = {"/admin/", "/emq/metrics"}
for model, model_admin in admin.site._registry.items():
    opts = model._meta
    urls.add(reverse("admin:app_list", args=[opts.app_label]))
    urls.add(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
    if model_admin.has_add_permission(request):
        try:
            urls.add(reverse(f"admin:{opts.app_label}_{opts.model_name}_add"))
        except NoReverseMatch:
            pass
    first = model_admin.get_queryset(request).first() if opts.managed else None
    if first is not None:
        urls.add(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[first.pk]))

failed = 0
for url in sorted(urls):
    response = client.get(url)
    print(response.status_code, url)
    if response.status_code != 200:
        failed += 1
        print(response.content.decode(errors="replace")[:2000])
sys.exit(1 if failed else 0)
