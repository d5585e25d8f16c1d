"""The allow-list in Django: ``manage.py emq_keys``, the ``AuthorizedKey`` admin
(staff only), and the store the broker's reloader reads and writes."""

from __future__ import annotations

import html
import time
from pathlib import Path

import pytest
import zmq
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from emq_django.security.keys import read_key
from emq_django.security.models import AuthorizedKey
from emq_django.security.store import load_authorized_keys, save_last_seen

pytestmark = pytest.mark.django_db(transaction=True)


def test_generate_writes_a_key_pair_and_registers_the_public_key(tmp_path: Path) -> None:
    call_command("emq_keys", "generate", "jm1", "--roles", "worker,client", "--dir", str(tmp_path))
    key = AuthorizedKey.objects.get(name="jm1")
    assert key.roles == "client,worker" and key.enabled
    secret_file = tmp_path / "jm1.key_secret"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    secret = read_key("CURVE_SECRET_KEY", str(secret_file), secret=True)
    assert zmq.curve_public(secret).decode() == key.public_key
    assert read_key("CURVE_SERVER_KEY", str(tmp_path / "jm1.key"), secret=False).decode() == (
        key.public_key
    )
    with pytest.raises(CommandError, match="exists"):
        call_command("emq_keys", "generate", "jm1", "--roles", "worker", "--dir", str(tmp_path))


def test_generate_refuses_unknown_roles_and_no_roles(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="unknown role"):
        call_command("emq_keys", "generate", "x", "--roles", "root", "--dir", str(tmp_path))
    with pytest.raises(CommandError, match="give --roles"):
        call_command("emq_keys", "generate", "x", "--dir", str(tmp_path))
    assert not AuthorizedKey.objects.exists()
    assert not list(tmp_path.iterdir())


def test_server_pair_is_not_registered(tmp_path: Path) -> None:
    call_command("emq_keys", "generate", "broker", "--server", "--dir", str(tmp_path))
    assert not AuthorizedKey.objects.exists()
    assert (tmp_path / "broker.key_secret").stat().st_mode & 0o777 == 0o600


def test_revoke_and_the_store_the_broker_reads() -> None:
    public, _ = zmq.curve_keypair()
    # (after "--": a Z85 key may start with "-", one time in 85)
    call_command("emq_keys", "add", "app", "--roles", "client", "--", public.decode())
    call_command("emq_keys", "revoke", "app")
    [entry] = load_authorized_keys()
    assert entry.name == "app" and not entry.enabled and entry.roles == frozenset({"client"})
    with pytest.raises(CommandError, match="no key named"):
        call_command("emq_keys", "revoke", "nobody")
    save_last_seen({"app"}, time.time())
    assert AuthorizedKey.objects.get(name="app").last_seen is not None
    dashed = next(k for k in iter(lambda: zmq.curve_keypair()[0].decode(), "") if k[0] == "-")
    call_command("emq_keys", "add", "dash", "--roles", "client", "--", dashed)
    assert AuthorizedKey.objects.get(name="dash").public_key == dashed


def test_add_refuses_a_bad_public_key() -> None:
    with pytest.raises(CommandError, match="Z85"):
        call_command("emq_keys", "add", "app", "not-a-key", "--roles", "client")


def test_admin_pages_are_staff_only_and_revoke() -> None:
    public, _ = zmq.curve_keypair()
    key = AuthorizedKey.objects.create(name="web", public_key=public.decode(), roles="monitor")
    url = "/admin/emq_security/authorizedkey/"
    anonymous = Client()
    assert anonymous.get(url).status_code == 302  # to the login page
    user = User.objects.create_user("plain", password="pw")
    plain = Client()
    plain.force_login(user)
    assert plain.get(url).status_code == 302
    staff = Client()
    staff.force_login(User.objects.create_superuser("boss", password="pw"))
    page = staff.get(url)
    assert page.status_code == 200 and html.escape(public.decode()) in page.content.decode()
    staff.post(url, {"action": "revoke", "_selected_action": [key.pk]})
    key.refresh_from_db()
    assert not key.enabled
