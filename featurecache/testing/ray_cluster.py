"""A real multi-node Ray cluster on this machine, for tests: `ray start --head` plus worker nodes.

Each node is its own `ray start` with its own temp folder, ports and custom resources, as on
separate hosts. Other jobs on the machine may run their own Ray, so nothing here uses
`ray stop` (which stops every Ray of the user): every process `ray start` spawns carries
FC_RAY_CLUSTER=<this cluster's token> and FC_RAY_NODE=<node name> in its environment (Ray's
processes inherit it, and setproctitle does not touch it), and `stop()` / `kill_raylet()` act on
those processes only.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

CLUSTER_VARIABLE = "FC_RAY_CLUSTER"
NODE_VARIABLE = "FC_RAY_NODE"
START_TIMEOUT_S = 180


def _psutil():
    import ray  # noqa: F401  (Ray vendors psutil in ray/thirdparty_files and puts it on the path)
    import psutil

    return psutil


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class LocalRayCluster:
    """Start with `start_head()`, add nodes with `add_node()`, always `stop()` (a context manager)."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fcray-", dir="/tmp")))
    token: str = field(default_factory=lambda: uuid.uuid4().hex)  # marks this cluster's processes
    auth_token: str = field(default_factory=lambda: secrets.token_hex(32))
    address: str | None = None

    def __enter__(self) -> LocalRayCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def env(self, node: str | None = None) -> dict[str, str]:
        """The environment of a `ray start`, or (node=None) of a driver joining the cluster."""
        # Token authentication on, with this cluster's own token (a driver must present it to join).
        env = {
            **os.environ,
            CLUSTER_VARIABLE: self.token,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.auth_token,
        }
        if node is not None:
            env[NODE_VARIABLE] = node
        return env

    def start_head(self, num_cpus: int, resources: dict[str, float]) -> str:
        port = free_port()
        self._ray_start(
            "head",
            num_cpus,
            resources,
            "--head",
            f"--port={port}",
            "--include-dashboard=false",
            f"--ray-client-server-port={free_port()}",
        )
        self.address = f"127.0.0.1:{port}"
        return self.address

    def add_node(self, name: str, num_cpus: int, resources: dict[str, float]) -> None:
        if self.address is None:
            raise RuntimeError("start_head() first")
        self._ray_start(name, num_cpus, resources, f"--address={self.address}")

    def _ray_start(self, name: str, num_cpus: int, resources: dict[str, float], *extra: str) -> None:
        # Every port is chosen here: the defaults (10001, 52365, ...) clash between nodes on one host.
        command = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            *extra,
            f"--num-cpus={num_cpus}",
            f"--resources={json.dumps(resources)}",
            f"--temp-dir={self.root / name}",
            "--disable-usage-stats",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
        ]
        result = subprocess.run(command, env=self.env(name), capture_output=True, text=True, timeout=START_TIMEOUT_S)
        if result.returncode != 0:
            raise RuntimeError(
                f"`ray start {' '.join(extra)}` ({name}) exited {result.returncode}:\n{result.stderr[-3000:]}"
            )

    def processes(self, node: str | None = None) -> list:
        """This cluster's processes (of one node, or all)."""
        psutil = _psutil()

        found = []
        for process in psutil.process_iter():
            try:
                env = process.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if env.get(CLUSTER_VARIABLE) == self.token and (node is None or env.get(NODE_VARIABLE) == node):
                found.append(process)
        return found

    def running_tasks(self, node: str, function_name: str) -> int:
        """Workers of `node` running a task of `function_name` (Ray titles them ray::<name>)."""
        count = 0
        for process in self.processes(node):
            try:
                if f"ray::{function_name}" in " ".join(process.cmdline()):
                    count += 1
            except Exception:  # the worker exited between listing and reading
                continue
        return count

    def kill_raylet(self, node: str) -> int:
        """SIGKILL the node's raylet (as when its host dies); returns its pid."""
        for process in self.processes(node):
            try:
                if process.name() == "raylet":
                    process.send_signal(signal.SIGKILL)
                    return process.pid
            except Exception:
                continue
        raise LookupError(f"no raylet found for node {node!r}")

    def stop(self) -> None:
        """Terminate this cluster's processes (SIGTERM, then SIGKILL) and remove its temp folder."""
        psutil = _psutil()
        for _ in range(3):  # a raylet may start a worker while the others go
            processes = self.processes()
            if not processes:
                break
            for process in processes:
                try:
                    process.terminate()
                except psutil.NoSuchProcess:
                    pass
            _, alive = psutil.wait_procs(processes, timeout=10)
            for process in alive:
                try:
                    process.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(alive, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
