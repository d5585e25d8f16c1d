"""Machines on one machine: network namespaces on a bridge, for tests where a
broker's host dies, pauses or is cut off.

    root namespace: bridge  <subnet>.1   (clients, job managers, PostgreSQL)
        |-- veth -- namespace 1: <subnet>.11  (a broker's "machine")
        |-- veth -- namespace 2: <subnet>.12
        ...

Every namespace reaches the root namespace and every other namespace through the
bridge; a process in the root namespace reaches them all. ``cut`` sets the
bridge's end of a machine's veth down: its packets are silently dropped both
ways (TCP sees no reset, only silence: a real partition, not a refusal), and
``restore`` brings it back with the connections that survived it. ``move_address``
moves a floating address (a virtual IP) from one machine to another, for
clients that know one address.

Needs root and iproute2's ``ip`` (``why_not()`` says which is missing). Names
carry the creating process's id, ``close`` deletes everything, and
``delete_orphans`` removes what a killed run left behind.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

NS_PREFIX = "emqn"  # namespaces: emqn-<pid>-<k>-<i>
BRIDGE_PREFIX = "eb"  # bridges: eb<pid>x<k>; veths: ev<pid>x<k>m<i>
HOST_OFFSET = 10  # machine i (from 1) is <subnet>.(10 + i)
_counter = itertools.count()


def why_not() -> str | None:
    """Why namespaces cannot be made here (a reason to skip), or None."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root (make test runs as root in CI)"
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; raises RuntimeError with ip's message when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def delete_orphans() -> None:
    """Namespaces and bridges of earlier runs whose process is gone (killed before
    its teardown); a run that is alive keeps its own."""
    for line in ip("netns", "list").stdout.splitlines():
        name = line.split(" ")[0]
        found = re.fullmatch(rf"{NS_PREFIX}-(\d+)-\d+-\d+", name)
        if found and not Path(f"/proc/{found.group(1)}").exists():
            ip("netns", "del", name, check=False)
    for line in ip("-o", "link", "show", "type", "bridge").stdout.splitlines():
        found = re.match(rf"\d+: ({BRIDGE_PREFIX}(\d+)x\d+)[:@]", line)
        if found and not Path(f"/proc/{found.group(2)}").exists():
            ip("link", "del", found.group(1), check=False)


@dataclass(frozen=True)
class Machine:
    """One namespace: its name, its address on the bridge, its veth's two ends."""

    index: int  # from 1
    namespace: str
    address: str
    iface: str  # the namespace's end of the veth
    port: str  # the bridge's end, in the root namespace

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this machine (``ip netns exec`` execs it: the pid
        of a Popen of this is the program's own)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


class Network:
    """``count`` machines on one bridge; a context manager that always cleans up.

    ``hub`` is the root namespace's address on the bridge (what a process of the
    root namespace, PostgreSQL for one, listens on to be reached by every machine).
    """

    def __init__(self, count: int) -> None:
        reason = why_not()
        if reason:
            raise RuntimeError(reason)
        delete_orphans()
        pid, k = os.getpid(), next(_counter)
        self.bridge = f"{BRIDGE_PREFIX}{pid}x{k}"
        self.subnet = _free_subnet()
        self.hub = f"{self.subnet}.1"
        self.machines: list[Machine] = []
        self._cut: set[int] = set()
        self._namespaces: list[str] = []  # made so far: close() deletes these
        names = [f"{NS_PREFIX}-{pid}-{k}-{i}" for i in range(1, count + 1)]
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.hub}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for i, namespace in enumerate(names, start=1):
                self.machines.append(self._add(i, namespace, f"ev{pid}x{k}m{i}"))
        except BaseException:
            self.close()
            raise

    def _add(self, i: int, namespace: str, port: str) -> Machine:
        assert len(port) <= 15, f"interface name {port} over 15 characters"
        machine = Machine(i, namespace, f"{self.subnet}.{HOST_OFFSET + i}", "eth0", port)
        ip("netns", "add", namespace)
        self._namespaces.append(namespace)
        ip("-n", namespace, "link", "set", "lo", "up")
        ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        ip("link", "set", port, "master", self.bridge)
        ip("link", "set", port, "up")
        ip("-n", namespace, "addr", "add", f"{machine.address}/24", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")
        return machine

    def __enter__(self) -> Network:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __getitem__(self, index: int) -> Machine:
        """Machine ``index``, counted from 1 as their addresses are."""
        return self.machines[index - 1]

    def address(self, host: int) -> str:
        """``<subnet>.host``: a spare address for ``add_address``/``move_address``
        (1 is the hub, 11.. the machines; take 100-250)."""
        return f"{self.subnet}.{host}"

    def run(self, machine: Machine, argv: Sequence[str], timeout: float = 30) -> str:
        """Run ``argv`` inside ``machine`` to its end; its stdout. RuntimeError when
        it fails."""
        done = subprocess.run(machine.argv(argv), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} in {machine.namespace}: {done.stderr.strip()}")
        return done.stdout

    # ---- faults ---------------------------------------------------------------------

    def cut(self, machine: Machine) -> None:
        """Partition ``machine`` from everything (the root namespace and the other
        machines): the bridge's end of its veth goes down, so its packets are
        dropped without a word both ways; its own processes keep running."""
        ip("link", "set", machine.port, "down")
        self._cut.add(machine.index)

    def restore(self, machine: Machine) -> None:
        """End ``machine``'s partition; returns once the bridge forwards to it again
        (a bridge port passes through listening/learning states only with STP on,
        which a new bridge has off)."""
        ip("link", "set", machine.port, "up")
        self._cut.discard(machine.index)

    def is_cut(self, machine: Machine) -> bool:
        return machine.index in self._cut

    def add_address(self, machine: Machine, address: str) -> None:
        """Give ``machine`` one more address (a virtual IP) on its veth."""
        ip("-n", machine.namespace, "addr", "add", f"{address}/24", "dev", machine.iface)

    def move_address(self, address: str, to: Machine) -> None:
        """Move a virtual IP to ``to``: taken from whichever machine holds it, given
        to ``to``, and every neighbour cache (the root namespace's and each
        machine's) forgets its old hardware address, so the next packet asks ARP
        again and reaches the new holder (no gratuitous ARP needed: every peer is
        ours). Connections to the old holder get a reset from the new one."""
        for machine in self.machines:
            if machine is not to and address in self.addresses(machine):
                ip("-n", machine.namespace, "addr", "del", f"{address}/24", "dev", machine.iface)
        if address not in self.addresses(to):
            self.add_address(to, address)
        ip("neigh", "flush", "to", address, check=False)
        for machine in self.machines:
            ip("-n", machine.namespace, "neigh", "flush", "to", address, check=False)

    def addresses(self, machine: Machine) -> list[str]:
        """The IPv4 addresses ``machine`` holds on its veth."""
        out = ip("-n", machine.namespace, "-o", "-4", "addr", "show", "dev", machine.iface).stdout
        return re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", out)

    # ---- teardown -------------------------------------------------------------------

    def close(self) -> None:
        """Delete every namespace (their veths go with them) and the bridge. Stop
        the processes running inside first: a namespace outlives its deletion
        while a process still runs in it."""
        for namespace in self._namespaces:
            ip("netns", "del", namespace, check=False)
        self._namespaces.clear()
        ip("link", "del", self.bridge, check=False)


def _free_subnet() -> str:
    """A /24 of 10.200-249.x.0 that no address or route of the root namespace uses
    (another run's bridge, a real network)."""
    used = ip("-4", "-o", "addr").stdout + ip("-4", "route").stdout
    rng = random.Random(int.from_bytes(os.urandom(8), "big"))
    for _ in range(1000):
        subnet = f"10.{rng.randrange(200, 250)}.{rng.randrange(0, 256)}"
        if not re.search(rf"(?<![\d.]){re.escape(subnet)}\.", used):
            return subnet
    raise RuntimeError("no free 10.200-249.x.0/24 subnet for the test network")
