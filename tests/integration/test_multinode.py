"""A 2-node Ray cluster on this machine runs a short demo submitted with `ray job submit`."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from verl_ext_testing import REPO, main_command

pytestmark = pytest.mark.ray

RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def two_node_cluster(tmp_path, monkeypatch):
    """Head and worker raylets on one host, each with one logical training slot (see verl_ext.platform.cpu).

    Both run in the foreground (--block) in process groups of their own, so tearing down stops this cluster
    only, never another Ray instance on the machine.
    """
    gcs_port, dashboard_port = _free_port(), _free_port()
    # a throwaway cluster on this host: Ray 2.60's token auth would need its token file passed to every client
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    env = {**os.environ, "RAY_ADDRESS": ""}
    common = ["--num-cpus=8", "--num-gpus=1", "--disable-usage-stats", "--block", "--node-ip-address=127.0.0.1"]
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    head = [RAY, "start", "--head", f"--port={gcs_port}", f"--temp-dir={ray_dir}",
            "--include-dashboard=true", f"--dashboard-port={dashboard_port}", "--dashboard-host=127.0.0.1"]
    worker = [RAY, "start", f"--address=127.0.0.1:{gcs_port}"]
    nodes = []
    try:
        nodes.append(_spawn(head + common, env, tmp_path / "head.log"))
        _wait_for_nodes(f"127.0.0.1:{gcs_port}", 1)
        nodes.append(_spawn(worker + common, env, tmp_path / "worker.log"))
        _wait_for_nodes(f"127.0.0.1:{gcs_port}", 2)
        yield f"127.0.0.1:{gcs_port}", f"http://127.0.0.1:{dashboard_port}"
    finally:
        for node in reversed(nodes):
            os.killpg(node.pid, signal.SIGTERM)
            node.wait(timeout=60)
        shutil.rmtree(ray_dir, ignore_errors=True)


def _spawn(command, env, log_path):
    log = open(log_path, "w")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_nodes(gcs_address: str, count: int, timeout_s: float = 120) -> None:
    from ray.util.state import list_nodes

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            alive = [n for n in list_nodes(address=gcs_address) if n.state == "ALIVE"]
            if len(alive) >= count:
                return
        except Exception:  # noqa: BLE001 -- the GCS is still starting
            pass
        time.sleep(1)
    raise TimeoutError(f"Ray cluster at {gcs_address} did not reach {count} nodes in {timeout_s}s")


def _training_worker_nodes(gcs_address: str) -> set[str]:
    from ray.util.state import list_actors

    actors = list_actors(address=gcs_address, detail=True, limit=10_000, raise_on_missing_output=False)
    return {a.node_id for a in actors if "ActorRolloutRefWorker" in (a.class_name or "") or "WorkerDict" in (a.class_name or "")}


def test_demo_runs_on_both_nodes(two_node_cluster, demo_data_dir, tmp_path):
    gcs_address, dashboard = two_node_cluster
    overrides = [
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        "trainer.total_training_steps=1",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        f"verl_ext.data_dir={demo_data_dir}",
        f"verl_ext.report_dir={tmp_path / 'report'}",
    ]
    command = main_command(*overrides)
    submit = [RAY, "job", "submit", f"--address={dashboard}", "--", *command]
    started = time.time()
    job = subprocess.run(submit, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert job.returncode == 0, f"job failed after {time.time() - started:.0f}s:\n{job.stdout[-4000:]}\n{job.stderr[-2000:]}"
    assert "steps: 1" in job.stdout, job.stdout[-3000:]
    nodes = _training_worker_nodes(gcs_address)
    assert len(nodes) == 2, f"training workers ran on {len(nodes)} node(s): {nodes}"
