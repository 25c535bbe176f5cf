"""What a local worker is told, and how it reports back.

``slipway train --workers N`` runs N processes on one machine as if they were N machines:
each gets a ``TF_CONFIG`` naming every worker's loopback address and its own index, which
is exactly what ``MultiWorkerMirroredStrategy`` reads (and what Kubeflow's training
operator sets on a real cluster). Worker 0 is the chief, as that strategy assumes when
the cluster has no separate ``chief`` task.

A worker proves it is making progress by rewriting its heartbeat file after every step;
a supervisor cannot tell a slow step from a collective waiting forever on a dead peer
any other way. A worker also dies with its supervisor: workers run in sessions of their
own (so a terminal's Ctrl-C reaches the supervisor alone), so nothing else would stop
them if the supervisor were killed outright, and a rerun would then train a second group
on the same checkpoints. This module is free of TensorFlow so that launching stays
instant.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from contracts.atomic_files import write_json_atomically

LOOPBACK = "127.0.0.1"
WORKER_INDEX_ENV = "SLIPWAY_WORKER_INDEX"
HEARTBEAT_ENV = "SLIPWAY_HEARTBEAT_FILE"
SUPERVISOR_PID_ENV = "SLIPWAY_SUPERVISOR_PID"
# The precision the supervisor chose for ``auto``: every worker must run the same one.
PRECISION_ENV = "SLIPWAY_PRECISION"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports nobody listens on right now.

    Every socket stays bound until all ``n`` are chosen, so the kernel cannot hand out
    the same port twice. The ports are free only at this moment: a worker that loses
    the race for one fails to start and the supervisor restarts the group on new ports.
    """
    if n < 1:
        raise ValueError(f"need at least one port, got {n}")
    with ExitStack() as stack:
        ports = []
        for _ in range(n):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOOPBACK, 0))
            ports.append(sock.getsockname()[1])
        return ports


def cluster_spec(ports: list[int]) -> dict[str, list[str]]:
    """The ``cluster`` part of ``TF_CONFIG``: one loopback address per worker."""
    return {"worker": [f"{LOOPBACK}:{port}" for port in ports]}


def tf_config(ports: list[int], index: int) -> str:
    """``TF_CONFIG`` for worker ``index`` of the cluster on ``ports``."""
    if not 0 <= index < len(ports):
        raise ValueError(f"worker index {index} is outside a cluster of {len(ports)}")
    return json.dumps(
        {"cluster": cluster_spec(ports), "task": {"type": "worker", "index": index}},
        sort_keys=True,
    )


def worker_env(ports: list[int], index: int, heartbeat_file: Path) -> dict[str, str]:
    """The variables that make a process worker ``index`` of the cluster on ``ports``."""
    return {
        "TF_CONFIG": tf_config(ports, index),
        WORKER_INDEX_ENV: str(index),
        HEARTBEAT_ENV: str(heartbeat_file),
        SUPERVISOR_PID_ENV: str(os.getpid()),
    }


def die_with_supervisor() -> None:
    """In a worker a supervisor started: have the kernel SIGKILL it when the supervisor dies.

    Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) fires when the thread that
    started the worker exits, which for the supervisor is the thread running its loop.
    A supervisor that died before this call is caught by the parent pid check. Killing
    is safe: a killed group resumes from its latest committed checkpoint. Does nothing in
    a process no supervisor started (a Kubeflow worker, a single run).
    """
    supervisor = os.environ.get(SUPERVISOR_PID_ENV)
    if supervisor is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    if os.getppid() != int(supervisor):
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class Heartbeat:
    step: int
    time: float


def write_heartbeat(path: Path, step: int) -> None:
    """Record that ``step`` is done; replaced atomically so a reader never sees half a file."""
    write_json_atomically(path, {"step": step, "time": time.time()})


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The last heartbeat in ``path``, or None when there is none (yet) or it is unreadable."""
    try:
        data = json.loads(path.read_text())
        return Heartbeat(step=int(data["step"]), time=float(data["time"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
