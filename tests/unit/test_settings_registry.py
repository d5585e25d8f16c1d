"""The settings registry: each EMQ_* setting declared once, read through one reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

import emq_django
from emq_django.conf import SECTIONS, read, setting_fields
from emq_django.results.conf import results_settings
from emq_django.scheduler.config import load_config
from emq_django.scheduler.timing import CATCH_UP_POLICIES
from emq_django.settings_registry import CATCH_UP_POLICIES as REGISTRY_POLICIES

PACKAGE = Path(emq_django.__file__).parent
# a settings read outside the one reader: an EMQ_ name from os.environ or Django's settings
DIRECT_READ = re.compile(r"""(environ\.get|getenv|getattr)\([^)]*["']EMQ_""")


def test_every_setting_has_a_section_and_a_meaning() -> None:
    for f in setting_fields():
        assert f.metadata["section"] in SECTIONS and f.metadata["doc"], f.name


def test_no_module_reads_an_emq_setting_but_the_registry() -> None:
    readers = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if DIRECT_READ.search(path.read_text())
    ]
    assert readers == []


def test_the_scheduler_catch_up_policies_are_the_registry_choices() -> None:
    assert REGISTRY_POLICIES == CATCH_UP_POLICIES


def test_results_and_scheduler_defaults_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    results = results_settings()
    assert (results.retention, results.prune_interval, results.show_args) == (604800, 60, False)
    assert (results.metrics_token, results.dashboard_timeout, results.max_buffer) == (
        "",
        0.75,
        50000,
    )
    config = load_config()
    assert (config.catch_up, config.poll_interval, config.grace) == ("once", 0.5, 1.0)


def test_one_reader_checks_a_bad_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMQ_RESULTS_RETENTION", "-1")
    with pytest.raises(ImproperlyConfigured, match="EMQ_RESULTS_RETENTION"):
        read("RESULTS_RETENTION")
    monkeypatch.delenv("EMQ_RESULTS_RETENTION")
    monkeypatch.setenv("EMQ_SCHEDULER_CATCH_UP", "sometimes")
    with pytest.raises(ImproperlyConfigured, match="use one of once, none, all"):
        load_config()


def test_a_command_option_is_checked_as_the_setting_it_overrides() -> None:
    with pytest.raises(ImproperlyConfigured, match="EMQ_SCHEDULER_POLL"):
        load_config(poll_interval=5)
    assert load_config(catch_up="all", poll_interval="1.5").poll_interval == 1.5


def test_a_broker_url_may_list_brokers_each_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from emq_django.conf import get_settings

    monkeypatch.setenv("EMQ_BROKER_URL", "tcp://10.0.0.1:47291, tcp://10.0.0.2:47291")
    assert get_settings().BROKER_URL.endswith("10.0.0.2:47291")
    monkeypatch.setenv("EMQ_WORKER_URL", "tcp://10.0.0.1:47290,10.0.0.2:47290")
    with pytest.raises(ImproperlyConfigured, match="'10.0.0.2:47290' is not a ZeroMQ address"):
        get_settings()
    monkeypatch.delenv("EMQ_WORKER_URL")
    monkeypatch.setenv("EMQ_FRONTEND_BIND", "tcp://10.0.0.1:47291,tcp://10.0.0.2:47291")
    with pytest.raises(ImproperlyConfigured, match="EMQ_FRONTEND_BIND=.* is not one ZeroMQ"):
        get_settings()
