"""Joining a multi-host run: `jax.distributed` with a rendezvous that names who is missing.

  python -m experiments.run --coordinator_address=host0:1234 --num_processes=2 --process_id=0 ...
"""

from __future__ import annotations

import os
import socket
import sys
import time

from absl import app

from experiments.launch import config as cfglib


def join(d: cfglib.DistributedConfig) -> None:
  """Joins a multi-host run (before any JAX computation) when the config asks for one; a process
  that cannot join within --distributed_timeout seconds stops with what to check."""
  import jax  # pylint: disable=import-outside-toplevel
  many = d.num_processes > 1 or d.coordinator_address is not None
  if not (many or d.distributed_auto):
    return
  kwargs = {"initialization_timeout": d.distributed_timeout}
  if not d.distributed_auto:
    if d.coordinator_address is None or d.num_processes < 2:
      raise app.UsageError("a multi-host run needs --coordinator_address=host:port and "
                           f"--num_processes >= 2, got {d.coordinator_address!r} and "
                           f"{d.num_processes}")
    if d.process_id >= d.num_processes:
      raise app.UsageError(f"--process_id must be in 0..{d.num_processes - 1} "
                           f"(--num_processes), got {d.process_id}")
    kwargs.update(coordinator_address=d.coordinator_address,
                  num_processes=d.num_processes, process_id=d.process_id)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes' collectives.
  if not d.distributed_auto:
    _wait_for_coordinator(d)
  try:
    jax.distributed.initialize(**kwargs)
  except Exception as e:  # pylint: disable=broad-except
    raise app.UsageError(
        f"could not join the multi-host run at --coordinator_address="
        f"{d.coordinator_address} within --distributed_timeout={d.distributed_timeout}s "
        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); check that process 0 "
        "is reachable there and that every process has the same --num_processes and its own "
        "--process_id") from e
  if jax.process_index() != 0:  # Process 0 prints the progress and tables.
    sys.stdout = open(os.devnull, "w", encoding="utf-8")  # pylint: disable=consider-using-with


def _wait_for_coordinator(d: cfglib.DistributedConfig) -> None:
  """A rendezvous before `jax.distributed.initialize`, on the port after the coordinator's: process
  0 waits for every other process to check in, and each of them for process 0's go-ahead, so a
  process left alone stops with a message naming who is missing (JAX's coordinator, once started,
  aborts the process natively when peers never join, which Python cannot catch)."""
  address, timeout, count = d.coordinator_address, d.distributed_timeout, d.num_processes
  host, _, port = address.rpartition(":")
  try:
    meeting = (host, int(port) + 1)
  except ValueError as e:
    raise app.UsageError(f"--coordinator_address must be host:port, got {address!r}") from e
  deadline = time.monotonic() + timeout
  if d.process_id == 0:
    sys.stderr.write(f"process 0 of {count}: waiting up to {timeout}s at {host}:{meeting[1]} for "
                     "the other processes to check in\n")
    _gather_peers(meeting, count, deadline, timeout)
    return
  answer = "no answer"
  while True:
    try:
      with socket.create_connection(meeting, timeout=1) as conn:
        conn.sendall(f"{d.process_id}\n".encode())
        conn.settimeout(max(deadline - time.monotonic(), 1.0))
        reply = conn.recv(2)
        if reply == b"go":
          return
        answer = f"an answer that is not process 0's ({reply[:16]!r})"
    except OSError as e:
      answer = str(e)
    if time.monotonic() > deadline:  # Also when something else answers on the port.
      raise app.UsageError(f"could not join the multi-host run: process 0 did not answer at "
                           f"--coordinator_address={address} (rendezvous port {meeting[1]}) "
                           f"after --distributed_timeout={timeout}s ({answer}); start process 0 "
                           "there first, and check that nothing else listens on that port")
    time.sleep(0.5)


def _gather_peers(meeting: tuple[str, int], count: int, deadline: float, timeout: int) -> None:
  """Process 0's side of the rendezvous: every process id 1..count-1 checks in before the
  deadline, then each is told to go on; else a UsageError naming the missing ids."""
  peers: dict[int, socket.socket] = {}
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      server.bind(("", meeting[1]))
    except OSError as e:
      raise app.UsageError(f"--coordinator_address: cannot listen on port {meeting[1]} (the "
                           f"coordinator's port + 1, the processes' rendezvous): {e}") from e
    server.listen(count)
    try:
      while len(peers) < count - 1:
        server.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
          conn, _ = server.accept()
        except TimeoutError:
          missing = sorted(set(range(1, count)) - set(peers))
          raise app.UsageError(
              f"fewer processes joined than --num_processes={count}: process ids {missing} did "
              f"not check in within --distributed_timeout={timeout}s; start "
              "them with the same --coordinator_address and --num_processes") from None
        conn.settimeout(5)
        try:
          peer = int(conn.recv(16).decode().strip())
        except (OSError, ValueError):
          conn.close()
          continue
        if not 0 < peer < count or peer in peers:
          conn.close()
          raise app.UsageError(f"a process checked in as --process_id={peer}: each of 1.."
                               f"{count - 1} must be given once (process 0 is this one)")
        peers[peer] = conn
      for conn in peers.values():
        conn.sendall(b"go")
    finally:
      for conn in peers.values():
        conn.close()
