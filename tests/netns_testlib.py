"""Hosts with their own network on this one machine: network namespaces joined by a veth
pair, each a "host" with its own address (10.x.y.1 and .2), so multi-host runs go over a
real interface instead of loopback, and a link can be cut (the veth set down). Traffic
stays inside the namespaces made here. Needs root (`ip netns`); `Hosts` skips the test,
with the reason, where they cannot be made."""

from __future__ import annotations

import os
import subprocess

import pytest


def _ip(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


class Hosts:
  """Two namespaces, host 0 and host 1, joined by a veth pair; use as a context manager."""

  def __init__(self):
    tag = f"{os.getpid() % 100000}"
    self.names = [f"c2jax{tag}h0", f"c2jax{tag}h1"]
    self.links = [f"c2j{tag}v0", f"c2j{tag}v1"]
    subnet = 16 + os.getpid() % 200
    self.addresses = [f"10.213.{subnet}.1", f"10.213.{subnet}.2"]

  def __enter__(self) -> "Hosts":
    if os.geteuid() != 0:
      pytest.skip("network namespaces (`ip netns`) need root; run the suite as root")
    steps = [("netns", "add", self.names[0]), ("netns", "add", self.names[1]),
             ("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1])]
    for i in range(2):
      steps += [("link", "set", self.links[i], "netns", self.names[i]),
                ("-n", self.names[i], "addr", "add", f"{self.addresses[i]}/24", "dev",
                 self.links[i]),
                ("-n", self.names[i], "link", "set", self.links[i], "up"),
                ("-n", self.names[i], "link", "set", "lo", "up")]
    for step in steps:
      done = _ip(*step)
      if done.returncode:
        self.__exit__(None, None, None)
        pytest.skip(f"could not make two network namespaces: `ip {' '.join(step)}`: "
                    f"{done.stderr.strip()}")
    return self

  def command(self, host: int, argv: list[str]) -> list[str]:
    """argv run inside host `host`'s namespace."""
    return ["ip", "netns", "exec", self.names[host], *argv]

  def cut(self, host: int) -> None:
    """Takes host `host`'s link down: the other host's packets to it are lost."""
    _ip("-n", self.names[host], "link", "set", self.links[host], "down")

  def __exit__(self, *exc) -> None:
    for name in self.names:
      pids = _ip("netns", "pids", name).stdout.split()
      for pid in pids:
        try:
          os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
          pass
      _ip("netns", "del", name)  # its end of the veth pair goes with it
