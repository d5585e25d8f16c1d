"""The admin's workflow page (issue 34): a workflow's steps from the job history,
in graph order, each linked to its job page; a step's job page links back."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.integration.test_admin_jobs import row

pytestmark = pytest.mark.django_db(transaction=True)
WORKFLOW = "/admin/emq_results/jobresult/workflow/"


@pytest.fixture
def staff() -> Client:
    user = User.objects.create_superuser("admin", "a@example.com", "admin")
    c = Client()
    c.force_login(user)
    return c


def test_the_workflow_page_lists_its_steps_in_graph_order_with_links(staff: Client) -> None:
    for path in ("root.body", "root.10", "root.2"):
        row(f"wf1/{path}", task="app.tasks.member")
    row("wf1/root.0", status="failed", error_type="ValueError", error="member 0 failed")
    row("wf2/root.0")  # another workflow's step: not listed

    page = staff.get(f"{WORKFLOW}wf1/").content.decode()

    listed = [p for p in ("root.0", "root.2", "root.10", "root.body") if f">{p}</a>" in page]
    assert listed == ["root.0", "root.2", "root.10", "root.body"]
    assert page.index(">root.2<") < page.index(">root.10<") < page.index(">root.body<")
    assert "ValueError: member 0 failed" in page
    assert 'href="/admin/emq_results/jobresult/wf1_2Froot.10/change/"' in page
    assert "wf2/root.0" not in page and ">wf2<" not in page


def test_a_steps_job_page_links_back_to_its_workflow(staff: Client) -> None:
    row("wf1/root.1")

    page = staff.get("/admin/emq_results/jobresult/wf1_2Froot.1/change/").content.decode()

    assert f'href="{WORKFLOW}wf1/"' in page
    assert "Step <code>root.1</code> of workflow" in page


def test_the_workflow_page_needs_the_view_permission() -> None:
    User.objects.create_user("nobody", "n@example.com", "pw", is_staff=True)
    c = Client()
    c.login(username="nobody", password="pw")

    assert c.get(f"{WORKFLOW}wf1/").status_code == 403
