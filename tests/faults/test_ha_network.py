"""The test network of the high-availability scenarios (tests/support/netns.py) on
its own: machines reach each other and the root namespace over ZeroMQ, a cut is a
silent partition that ``restore`` ends, a virtual IP moves, and nothing is left
behind."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.support import EmqProcesses, ManagedProcess
from tests.support.netns import Machine, Network, ip, why_not

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.timeout(120)]

# A REP server that answers "<name> <request>" on its address: run inside a machine.
ECHO = """
import sys, zmq
sock = zmq.Context().socket(zmq.REP)
sock.bind(sys.argv[1])
print("ready", flush=True)
while True:
    sock.send_string(sys.argv[2] + " " + sock.recv_string())
"""
PORT = 5599  # any: nothing else listens inside the test's namespaces


@pytest.fixture
def net() -> Iterator[Network]:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    with Network(2) as net:
        yield net


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[EmqProcesses]:
    with EmqProcesses(tmp_path / "logs") as procs:
        yield procs


def echo(procs: EmqProcesses, machine: Machine, bind: str, name: str) -> ManagedProcess:
    server = procs.start_program(
        machine.argv([sys.executable, "-c", ECHO, bind, name]), name=f"echo-{name}"
    )
    procs.wait_for_output(server, "ready", timeout=30, stream="stdout")
    return server


def ask(context: zmq.Context[Any], address: str, text: str, timeout: float) -> str | None:
    """One request on a fresh socket; None if no answer within ``timeout`` s."""
    sock = context.socket(zmq.REQ)
    sock.linger = 0
    try:
        sock.connect(address)
        sock.send_string(text)
        if sock.poll(int(timeout * 1000)):
            return sock.recv_string()
        return None
    finally:
        sock.close(linger=0)


def ask_from(net: Network, machine: Machine, address: str) -> str:
    """A request made from inside ``machine``: its answer (empty on no answer)."""
    probe = (
        "import sys, zmq; s = zmq.Context().socket(zmq.REQ); s.linger = 0;"
        "s.connect(sys.argv[1]); s.send_string('hi');"
        "print(s.recv_string() if s.poll(5000) else '')"
    )
    return net.run(machine, [sys.executable, "-c", probe, address]).strip()


def test_machines_reach_each_other_and_the_hub(net: Network, procs: EmqProcesses) -> None:
    one, two = net[1], net[2]
    assert one.address != two.address != net.hub
    echo(procs, one, f"tcp://{one.address}:{PORT}", "one")
    with zmq.Context() as context:
        assert ask(context, f"tcp://{one.address}:{PORT}", "root", 10) == "one root"
    assert ask_from(net, two, f"tcp://{one.address}:{PORT}") == "one hi"
    # the root namespace's hub address is reached from inside a machine
    echo(procs, one, f"tcp://{one.address}:{PORT + 1}", "unused")  # a second server there
    hub = procs.start_program(
        [sys.executable, "-c", ECHO, f"tcp://{net.hub}:{PORT + 2}", "hub"], name="echo-hub"
    )
    procs.wait_for_output(hub, "ready", timeout=30, stream="stdout")
    assert ask_from(net, two, f"tcp://{net.hub}:{PORT + 2}") == "hub hi"


def test_a_cut_machine_is_silent_until_restored(net: Network, procs: EmqProcesses) -> None:
    one = net[1]
    echo(procs, one, f"tcp://{one.address}:{PORT}", "one")
    with zmq.Context() as context:
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(f"tcp://{one.address}:{PORT}")
        dealer.send_multipart([b"", b"before"])
        assert dealer.poll(10_000), "no answer before the cut"
        assert dealer.recv_multipart() == [b"", b"one before"]
        net.cut(one)
        assert net.is_cut(one)
        dealer.send_multipart([b"", b"during"])  # on the connection made before the cut
        assert not dealer.poll(1500), "a cut machine answered"
        assert ask(context, f"tcp://{one.address}:{PORT}", "new", 1.0) is None
        # from inside, the hub is as unreachable (both ways)
        assert ask_from(net, net[2], f"tcp://{one.address}:{PORT}") == ""
        net.restore(one)
        # TCP retransmits what was sent during the cut: the same connection answers
        assert dealer.poll(15_000), "no answer after the restore"
        assert dealer.recv_multipart() == [b"", b"one during"]
        dealer.close(linger=0)
        assert ask(context, f"tcp://{one.address}:{PORT}", "after", 10) == "one after"


def test_a_virtual_ip_moves_between_machines(net: Network, procs: EmqProcesses) -> None:
    one, two = net[1], net[2]
    vip = net.address(100)
    net.add_address(one, vip)
    assert vip in net.addresses(one)
    echo(procs, one, f"tcp://*:{PORT}", "one")
    echo(procs, two, f"tcp://*:{PORT}", "two")
    with zmq.Context() as context:
        assert ask(context, f"tcp://{vip}:{PORT}", "a", 10) == "one a"
        net.move_address(vip, two)
        assert vip not in net.addresses(one) and vip in net.addresses(two)
        assert ask(context, f"tcp://{vip}:{PORT}", "b", 10) == "two b"
        net.move_address(vip, one)
        assert ask(context, f"tcp://{vip}:{PORT}", "c", 10) == "one c"


def test_close_leaves_nothing_behind() -> None:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    with Network(2) as net:
        names = [m.namespace for m in net.machines]
        bridge = net.bridge
        listed = ip("netns", "list").stdout
        assert all(name in listed for name in names)
    listed = ip("netns", "list").stdout
    assert not any(name in listed for name in names)
    assert ip("link", "show", bridge, check=False).returncode != 0
    # a failure while building also cleans up what was made
    with pytest.raises(ZeroDivisionError), Network(1) as net:
        names = [net[1].namespace]
        raise ZeroDivisionError
    assert not any(name in ip("netns", "list").stdout for name in names)
