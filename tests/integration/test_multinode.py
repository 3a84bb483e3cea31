"""A 2-node Ray cluster on this machine with token authentication on, started by docker/ray-head.sh and
docker/ray-worker.sh, runs a short demo submitted by scripts/launch_cluster.sh; clients without the token are refused.

Every Ray client runs in a subprocess or speaks plain HTTP: Ray caches the token per process, so a client in the
pytest process would carry this cluster's token into the local clusters other tests start.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from verl_ext_testing import REPO

pytestmark = pytest.mark.ray

BIN = Path(sys.executable).parent
RAY = str(BIN / "ray")


def _node_args() -> list[str]:
    # every port Ray would otherwise take at a fixed number is free-picked: two nodes share this host, and so may
    # other Ray instances (a dashboard agent that cannot bind leaves its node unable to run a job's driver)
    return ["--num-cpus=8", "--node-ip-address=127.0.0.1", f"--dashboard-agent-listen-port={_free_port()}"]


@dataclass(frozen=True)
class Cluster:
    gcs_address: str  # host:port, what nodes join
    dashboard: str  # http://host:port, the job API
    token_file: Path
    logs: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _user_env(home: Path, **settings: str) -> dict[str, str]:
    """This environment as a user on a fresh machine has it: the venv's `ray` and `python` first, no Ray address or
    token settings of its own (HOME is a fresh directory, so no ~/.ray/auth_token either), plus `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH_", "RAY_ADDRESS"))}
    return {**env, "PATH": f"{BIN}:{env['PATH']}", "HOME": str(home), **settings}


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> Path:
    """The cluster's token, made as docs/cluster.md says, then readable by its owner only."""
    home = tmp_path_factory.mktemp("admin")
    subprocess.run([RAY, "get-auth-token", "--generate"], env=_user_env(home), check=True, capture_output=True)
    path = home / ".ray" / "auth_token"
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def two_node_cluster(token_file, tmp_path_factory):
    """Head and worker on one host, each with one logical training slot (see verl_ext.platform.cpu). The head reads
    the token from a file (RAY_AUTH_TOKEN_PATH, as from a mounted secret), the worker from RAY_AUTH_TOKEN.

    Both scripts run Ray in the foreground in process groups of their own, so tearing down stops this cluster only,
    never another Ray instance on the machine.
    """
    logs = tmp_path_factory.mktemp("cluster")
    home = tmp_path_factory.mktemp("node_home")
    gcs_port, dashboard_port = _free_port(), _free_port()
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    # a throwaway cluster: stopping it need not wait out Ray's 30 s drain for the node's work to move elsewhere
    node = {"RAY_NUM_GPUS": "1", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    head_env = _user_env(home, RAY_PORT=str(gcs_port), RAY_AUTH_TOKEN_PATH=str(token_file), **node)
    worker_env = _user_env(home, RAY_HEAD=f"127.0.0.1:{gcs_port}", RAY_AUTH_TOKEN=token_file.read_text(), **node)
    head = [str(REPO / "docker" / "ray-head.sh"), f"--temp-dir={ray_dir}", "--include-dashboard=true",
            f"--dashboard-port={dashboard_port}", f"--ray-client-server-port={_free_port()}", *_node_args()]
    cluster = Cluster(f"127.0.0.1:{gcs_port}", f"http://127.0.0.1:{dashboard_port}", token_file, logs)
    nodes = []
    try:
        nodes.append(_spawn(head, head_env, logs / "head.log"))
        _wait_for_nodes(cluster, 1)
        nodes.append(_spawn([str(REPO / "docker" / "ray-worker.sh"), *_node_args()], worker_env, logs / "worker.log"))
        _wait_for_nodes(cluster, 2)
        yield cluster
    finally:
        for node in reversed(nodes):
            _stop(node)
        shutil.rmtree(ray_dir, ignore_errors=True)


def _spawn(command, env, log_path):
    with open(log_path, "w") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process, timeout_s: float = 60) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:  # it has already exited
        pass
    process.wait(timeout=timeout_s)


def _http_status(url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _get_json(cluster: Cluster, path: str):
    request = urllib.request.Request(cluster.dashboard + path,
                                     headers={"Authorization": f"Bearer {cluster.token_file.read_text()}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def _state(cluster: Cluster, kind: str) -> list[dict]:
    """Ray's state API (`ray list nodes/actors`) over HTTP with the token."""
    return _get_json(cluster, f"/api/v0/{kind}?limit=10000&detail=1")["data"]["result"]["result"]


def _wait_for_nodes(cluster: Cluster, count: int, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if sum(n["state"] == "ALIVE" for n in _state(cluster, "nodes")) >= count:
                return
        except urllib.error.HTTPError as error:
            if error.code in (401, 403):  # the head refuses our token: waiting will not help
                raise
        except (urllib.error.URLError, ConnectionError, KeyError, ValueError):  # the dashboard is still starting
            pass
        time.sleep(1)
    raise TimeoutError(f"Ray cluster at {cluster.gcs_address} did not reach {count} nodes in {timeout_s}s")


def _training_worker_nodes(cluster: Cluster) -> set[str]:
    names = ("ActorRolloutRefWorker", "WorkerDict")
    return {a["node_id"] for a in _state(cluster, "actors") if any(n in (a.get("class_name") or "") for n in names)}


def test_demo_runs_on_both_nodes(two_node_cluster, tmp_path):
    cluster = two_node_cluster
    # the submitting user's token file, as on a workstation: RAY_AUTH_TOKEN_PATH
    env = _user_env(tmp_path, RAY_ADDRESS=cluster.dashboard, RAY_AUTH_TOKEN_PATH=str(cluster.token_file),
                    NNODES="2", GPUS_PER_NODE="1", RECIPE="demo_cpu")
    overrides = [
        "trainer.total_training_steps=1",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        f"verl_ext.report_dir={tmp_path / 'report'}",
    ]
    started = time.time()
    job = subprocess.run([str(REPO / "scripts" / "launch_cluster.sh"), *overrides], env=env, capture_output=True,
                         text=True, timeout=900, cwd=REPO)
    assert job.returncode == 0, \
        f"job failed after {time.time() - started:.0f}s:\n{job.stdout[-4000:]}\n{job.stderr[-2000:]}"
    assert "steps: 1" in job.stdout, job.stdout[-3000:]
    nodes = _training_worker_nodes(cluster)
    assert len(nodes) == 2, f"training workers ran on {len(nodes)} node(s): {nodes}"
    token = cluster.token_file.read_text()
    outputs = {"job output": job.stdout + job.stderr, **{p.name: p.read_text() for p in cluster.logs.iterdir()}}
    for name, text in outputs.items():
        assert token not in text, f"the token is printed in the {name}"


def test_head_refuses_clients_without_the_token(two_node_cluster, tmp_path):
    cluster = two_node_cluster
    wrong = "0" * 64
    # nodes trying to join: Ray takes about 25 s to give up, so both attempts run while the job API is checked
    joins = {
        "no token": _spawn([RAY, "start", f"--address={cluster.gcs_address}", "--block", *_node_args()],
                           _user_env(tmp_path), tmp_path / "join_no_token.log"),
        "wrong token": _spawn([str(REPO / "docker" / "ray-worker.sh"), *_node_args()],
                              _user_env(tmp_path, RAY_HEAD=cluster.gcs_address, RAY_AUTH_TOKEN=wrong),
                              tmp_path / "join_wrong_token.log"),
    }
    try:
        # the job API over plain HTTP; the right token is the control
        jobs = cluster.dashboard + "/api/jobs/"
        assert _http_status(jobs, None) == 401
        assert _http_status(jobs, wrong) == 403
        assert _http_status(jobs, cluster.token_file.read_text()) == 200
        # `ray job submit` as a user without the token, and through launch_cluster.sh with a wrong one
        marker = f"refused-{os.getpid()}"
        no_token = subprocess.run([RAY, "job", "submit", f"--address={cluster.dashboard}", "--", "echo", marker],
                                  env=_user_env(tmp_path), capture_output=True, text=True, timeout=120)
        assert no_token.returncode != 0 and "Authentication required" in no_token.stderr, no_token.stderr[-2000:]
        wrong_token = subprocess.run(
            [str(REPO / "scripts" / "launch_cluster.sh"), f"trainer.experiment_name={marker}"],
            env=_user_env(tmp_path, RAY_ADDRESS=cluster.dashboard, RAY_AUTH_TOKEN=wrong),
            capture_output=True, text=True, timeout=120)
        assert wrong_token.returncode != 0 and "Authentication failed" in wrong_token.stderr, wrong_token.stderr[-2000:]
        assert not [job for job in _get_json(cluster, "/api/jobs/") if marker in job["entrypoint"]]
        for why, process in joins.items():
            process.wait(timeout=120)
            log = (tmp_path / f"join_{why.replace(' ', '_')}.log").read_text()
            assert process.returncode != 0 and "InvalidAuthToken" in log, f"a node with {why} joined:\n{log[-2000:]}"
        assert sum(n["state"] == "ALIVE" for n in _state(cluster, "nodes")) == 2
    finally:
        for process in joins.values():
            if process.poll() is None:
                _stop(process)
