"""A real multi-node Ray cluster on this machine, built the way deploy/ builds one.

Three `ray start` nodes, each with its own temp dir as separate machines would have: a head with no
CPU and no custom resource (it runs the driver, not training), a parameter-server node with the
`ps` resource and a capped `memory`, and a training node with `trainer` and 2 CPUs. Token auth is
on. `ray job submit --working-dir . -- python jobs/train.py --config jobs/configs/multinode.yaml`
runs the whole job; the test then checks where every actor ran (Ray's state API keeps dead actors
with their node id), that the job succeeded, and that the model and the exports are complete.
Every process of the cluster is stopped afterwards, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pyarrow.parquet as pq
import pytest
from conftest import free_ports, ports_outside_ephemeral

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
CONFIG = "jobs/configs/multinode.yaml"
MiB = 1 << 20
PS_NODE_MEMORY = 1536 * MiB  # Ray `memory` of the ps node: room for the two servers' requests, no more

pytestmark = pytest.mark.slow


def _processes_of(temp_root: str) -> list[int]:
    """Pids whose command line names our temp root: every Ray process of this cluster, nothing else."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
            if temp_root.encode() in fh.read() and int(pid) != os.getpid():
                found.append(int(pid))
    return found


def _ray(args: list[str], env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([RAY, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _state(kind: str, address: str, env: dict) -> list[dict]:
    """`ray list KIND` from Ray's state API, as dicts."""
    done = _ray(["list", kind, "--address", address, "--format", "json", "--detail", "--limit", "1000"], env)
    if done.returncode != 0:
        return []
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:  # "No resource in the cluster" while nothing has registered yet
        return []


@contextlib.contextmanager
def local_cluster():
    """Head (no CPU), a `ps` node and a `trainer` node on this machine; yields (address, env, nodes)."""
    temp_root = tempfile.mkdtemp(prefix="raymn", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           # `python` in the job's entrypoint is this interpreter, as it is the image's on a cluster
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    env.pop("RAY_ADDRESS", None)
    node_ports = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                  "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port"]
    # own ports for everything that has a fixed default: the session's other Ray holds those
    gcs, dash, client, *taken = free_ports(3 + 3 * len(node_ports))
    common = ["--block", "--disable-usage-stats", "--object-store-memory", str(100 * MiB)]
    specs = {
        "head": ["--head", "--port", str(gcs), "--num-cpus", "0", "--dashboard-host", "127.0.0.1",
                 "--dashboard-port", str(dash), "--ray-client-server-port", str(client)],
        "ps": ["--address", f"127.0.0.1:{gcs}", "--num-cpus", "0", "--memory", str(PS_NODE_MEMORY),
               "--resources", json.dumps({"ps": 2})],
        "trainer": ["--address", f"127.0.0.1:{gcs}", "--num-cpus", "2", "--resources", json.dumps({"trainer": 2})],
    }
    flags = {name: [x for flag in node_ports for x in (flag, str(taken.pop()))]
                   + ["--min-worker-port", "0", "--max-worker-port", "0"] for name in specs}
    procs: dict[str, subprocess.Popen] = {}
    address = f"http://127.0.0.1:{dash}"

    def start(name):
        # each node its own temp dir, as on separate machines (two nodes starting at once in one
        # session dir race for the same socket names)
        with open(os.path.join(temp_root, f"{name}.log"), "w") as log:  # the child keeps its own copy
            procs[name] = subprocess.Popen(
                [RAY, "start", *common, *specs[name], *flags[name], "--temp-dir", os.path.join(temp_root, name)],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    try:
        start("head")
        deadline = time.time() + 90
        while _ray(["job", "list", "--address", address], env).returncode != 0:
            assert time.time() < deadline and procs["head"].poll() is None, _logs(temp_root, "head")
            time.sleep(1)
        start("ps")
        start("trainer")
        while len([n for n in _state("nodes", address, env) if n["state"] == "ALIVE"]) < 3:
            dead = [n for n, p in procs.items() if p.poll() is not None]
            assert time.time() < deadline and not dead, _logs(temp_root, *(dead or procs))
            time.sleep(1)
        yield address, env, _state("nodes", address, env)
    finally:
        # Hard stop, workers first: a graceful SIGTERM drains for ~30 s per node. Each `ray start
        # --block` leads a process group with its raylet, GCS and agents; Ray's worker processes
        # have groups of their own, so sweep everything that names our temp root after that.
        for name in reversed(list(procs)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(procs[name].pid, signal.SIGKILL)
        for proc in procs.values():
            proc.wait(timeout=60)
        for pid in _processes_of(temp_root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 20
        while _processes_of(temp_root) and time.time() < deadline:
            time.sleep(0.5)
        leftover = _processes_of(temp_root)
        shutil.rmtree(temp_root, ignore_errors=True)
        assert not leftover, f"Ray processes still running after stop: {leftover}"


def _logs(temp_root: str, *names: str) -> str:
    out = []
    for name in names:
        with contextlib.suppress(OSError), open(os.path.join(temp_root, f"{name}.log")) as fh:
            out.append(f"--- {name} ---\n" + fh.read()[-2000:])
    return "\n".join(out) or "no logs"


def _submit(address: str, env: dict, args: list[str]) -> subprocess.CompletedProcess:
    for _ in range(15):  # the job API answers before a node's agent can take a job: retry that
        done = _ray(["job", "submit", "--address", address, "--working-dir", ROOT, "--", *args], env, timeout=240)
        if "No available agent" not in done.stdout + done.stderr:
            return done
        time.sleep(2)
    return done


def test_the_ports_a_test_cluster_takes_are_free_distinct_and_out_of_the_kernels_ephemeral_range(monkeypatch):
    with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
        first, last = map(int, fh.read().split())
    low, high = ports_outside_ephemeral()
    assert high < first or low > last
    spans = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
        ports = free_ports(20)
        assert len(set(ports)) == 20 and all(low <= p <= high for p in ports), ports
        spans.append((min(ports), max(ports)))
    assert spans[0][1] < spans[1][0], f"the two test processes' ports overlap: {spans}"
    # a port something listens on is never handed out: with so many processes that gw0's span is a dozen
    # ports, all but one of them taken, that one is the answer every time
    workers = (high - low + 1) // 12
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    with contextlib.ExitStack() as stack:
        span = list(range(low, low + (high - low + 1) // workers))
        left = []
        for port in span:
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("", port))
                sock.listen()
            except OSError:
                continue
            left.append(sock)
        assert left, f"every port of {span[0]}-{span[-1]} is taken on this machine"
        left.pop().close()  # the one free port
        free = free_ports(1)
        assert [free_ports(1) for _ in range(5)] == [free] * 5 and free[0] in span


def test_job_on_three_nodes_places_servers_and_workers_by_resource(tmp_path):
    t0 = time.time()
    out = {name: str(tmp_path / name) for name in ("corpus", "model", "exports")}
    heldout = str(tmp_path / "heldout.parquet")
    with local_cluster() as (address, env, nodes):
        t_up = time.time() - t0
        by_role = {}
        for n in nodes:
            res = n["resources_total"]
            role = "head" if n["is_head_node"] else "ps" if res.get("ps") else "trainer" if res.get("trainer") else "?"
            by_role[role] = n["node_id"]
        assert set(by_role) == {"head", "ps", "trainer"}, nodes

        refused = _ray(["job", "list", "--address", address], {**env, "RAY_AUTH_TOKEN": "wrong-token"})
        assert refused.returncode != 0  # token auth is really on

        t_job = time.time()
        done = _submit(address, env, [
            "python", "jobs/train.py", "--config", CONFIG, "--no-progress", "--corpus", out["corpus"],
            "--out", out["model"], "--exports", out["exports"], "--holdout-out", heldout])
        job_seconds = time.time() - t_job
        log = done.stdout + done.stderr
        assert done.returncode == 0 and "succeeded" in log, log[-4000:]

        jobs = _state("jobs", address, env)
        assert [j["status"] for j in jobs] == ["SUCCEEDED"], jobs
        actors = _state("actors", address, env)  # dead ones too, each with the node it ran on
        servers, workers, supervisors = ([a for a in actors if a["class_name"] == name]
                                         for name in ("ParameterServer", "Worker", "JobSupervisor"))

    role_of = {node_id: role for role, node_id in by_role.items()}
    placement = {"ParameterServer": [role_of.get(a["node_id"]) for a in servers],
                 "Worker": [role_of.get(a["node_id"]) for a in workers],
                 "JobSupervisor": [role_of.get(a["node_id"]) for a in supervisors]}
    print("\nnodes: " + ", ".join(f"{role} {node_id[:8]}" for role, node_id in by_role.items()))
    for name, actors in (("ParameterServer", servers), ("Worker", workers)):
        for a in actors:
            print(f"  {name:16s} on {role_of.get(a['node_id'])} node {a['node_id'][:8]} "
                  f"pid {a['pid']} {a['state']}, asked for {a['required_resources']}")
    print(f"job: {jobs[0]['submission_id']} {jobs[0]['status']}; cluster up {t_up:.1f}s, job {job_seconds:.1f}s, "
          f"total {time.time() - t0:.1f}s")

    assert placement == {"ParameterServer": ["ps", "ps"], "Worker": ["trainer", "trainer"],
                         "JobSupervisor": ["head"]}, placement
    for a in servers:
        assert a["required_resources"].get("ps") == 1 and a["required_resources"].get("memory", 0) > 0
        assert "CPU" not in a["required_resources"]
    for a in workers:
        assert a["required_resources"].get("trainer") == 1 and a["required_resources"].get("CPU") == 1

    result = _check_model_and_exports(out, dim=16, num_ps=2)
    print("job stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in result["stages"].items()))


def _check_model_and_exports(out: dict, dim: int, num_ps: int) -> dict:
    from doc2vec_dist import modeldir

    _, manifest = modeldir.load_manifest(out["model"])
    for table in ("docs", "words_out"):
        parts = manifest["tables"][table]["parts"]
        assert len(parts) == num_ps, (table, parts)
        rows = sum(len(ids) for part in modeldir.ModelDir(out["model"]).parts(table, verify=True)
                   for ids, vectors in part if vectors.shape[1] == dim)
        assert rows == sum(p["rows"] for p in parts) > 0
    summary = read_json(out["model"], "config.json")["summary"]
    assert summary["epochs"] == 3 and summary["tokens"] > 0
    users = pq.read_table(os.path.join(out["exports"], "users.parquet"))
    assert users.num_rows > 4900 and users.schema.field("vector").type.list_size == dim
    assert pq.read_table(os.path.join(out["exports"], "urls.parquet")).num_rows > 4000
    assert os.path.exists(os.path.join(out["exports"], "users.index", "index.faiss"))
    result = read_json(out["exports"], "job.json")
    assert set(result["stages"]) >= {"prepare", "train", "export", "index", "evaluate"}
    assert len(result["example"]["similar_users"]) == 5
    return result


def read_json(*path: str) -> dict:
    with open(os.path.join(*path)) as fh:
        return json.load(fh)
