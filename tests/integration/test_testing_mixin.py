"""A user's Django ``TestCase`` with ``InMemoryBrokerMixin``: jobs run inside the
test's transaction, and their database writes are seen by the test."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.test import TestCase, override_settings

import emq_django as emq
from emq_django.testing import InMemoryBroker, InMemoryBrokerMixin


@emq.task(retries=1)
def add_group(name: str) -> int:
    if not name.strip():
        raise ValueError("a group needs a name")
    return Group.objects.create(name=name).pk


class GroupTasksTest(InMemoryBrokerMixin, TestCase):
    def test_the_job_writes_in_the_tests_transaction(self) -> None:
        pk = add_group.delay("editors").get()

        self.assertEqual(Group.objects.get(pk=pk).name, "editors")
        self.assertEqual(Group.objects.count(), 1)  # the connection is still the test's

    def test_a_failed_attempt_is_retried_once_the_clock_moves(self) -> None:
        result = add_group.delay(" ")

        self.emq_broker.advance(60)

        with self.assertRaisesMessage(emq.TaskFailed, "a group needs a name"):
            result.get()
        self.assertEqual(self.emq_broker.dead_letters()[0]["attempts"], 2)
        self.assertEqual(Group.objects.count(), 0)

    def test_a_job_sent_on_commit_runs_once_the_callbacks_run(self) -> None:
        with self.captureOnCommitCallbacks(execute=True):
            result = add_group.delay_on_commit("after commit")

        self.assertEqual(Group.objects.get(pk=result.get()).name, "after commit")


@override_settings(EMQ_EAGER=True)
def test_installing_with_eager_on_says_why_it_cannot_work() -> None:
    with pytest.raises(ImproperlyConfigured, match="EMQ_EAGER is on"):
        InMemoryBroker().install()
