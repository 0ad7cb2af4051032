"""Ray nodes in network namespaces, joined by bandwidth-capped links (benchmarks/netcluster.py), and a node
killed under a training job (issue 28, items 1, 2 and 4).

These tests make network namespaces, veth pairs, a bridge and tc qdiscs, which needs root: CI runs as
root; elsewhere they are skipped, saying so. Each run's namespaces carry its own name prefix and are
removed when the test ends, pass or fail; the tests check that nothing of theirs is left. The nodes
have no route to any other network. tc's `netem` does not exist on these kernels: the links are
capped in bandwidth, never delayed.

The node test (marked netns and slow) is the small version of the network fault runs: the sample
corpus, 2 namespaces (head and parameter servers in one, the trainer in the other), the trainer's
link capped, and its node killed mid-run: the job stops with one error line and the resume command
within Ray's detection time, nothing committed is lost, and the resumed job completes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import load_benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


netcluster = load_benchmark("netcluster", "netcluster")
WHY_NOT = netcluster.available()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(WHY_NOT is not None, reason=f"{WHY_NOT}")]

REACH = """
import socket, sys
for addr in sys.argv[1:]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((addr, 9))
        print(addr, "open")
    except ConnectionRefusedError:
        print(addr, "reached")  # nothing listens there, but the address answered
    except OSError as e:
        print(addr, "unreachable", e.strerror)
"""

SEND = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5001), timeout=30)
block = b"x" * 65536
t0 = time.monotonic()
for _ in range(int(sys.argv[2]) // 65536):
    s.sendall(block)
s.shutdown(socket.SHUT_WR)
s.recv(1)  # the receiver's byte: everything arrived
print(time.monotonic() - t0)
"""

RECEIVE = """
import socket
srv = socket.create_server(("0.0.0.0", 5001))
conn, _ = srv.accept()
while conn.recv(1 << 20):
    pass
conn.sendall(b"k")
"""


def leftovers(run_id: str) -> list[str]:
    return [n for n in netcluster.our_namespaces() if n.startswith(run_id)]


def test_namespaces_reach_only_each_other_and_the_capped_link_holds_its_rate():
    cluster = netcluster.NetCluster(["head", "trainer"], 0.02, ray=False)  # 20 Mbit/s: 2.5 MB/s
    with cluster:
        assert len(leftovers(cluster.run_id)) == 3  # the two nodes and the switch
        reach = cluster.popen("head", [sys.executable, "-c", REACH, cluster.node("trainer").address, "192.0.2.1",
                                       "8.8.8.8"], stdout=subprocess.PIPE, text=True)
        out = reach.communicate(timeout=30)[0]
        assert f"{cluster.node('trainer').address} reached" in out, out
        assert "192.0.2.1 unreachable Network is unreachable" in out and "8.8.8.8 unreachable" in out, out
        routes = subprocess.run(["ip", "-n", cluster.head.netns, "route"], capture_output=True, text=True,
                                check=True).stdout
        assert "default" not in routes and routes.split()[0] == "10.213.0.0/24", routes

        receiver = cluster.popen("trainer", [sys.executable, "-c", RECEIVE])
        time.sleep(1)
        before = cluster.counters()
        size = 4 << 20
        sender = cluster.popen("head", [sys.executable, "-c", SEND, cluster.node("trainer").address, str(size)],
                               stdout=subprocess.PIPE, text=True)
        seconds = float(sender.communicate(timeout=60)[0])
        receiver.wait(timeout=10)
        moved = netcluster.traffic(before, cluster.counters())
    assert not leftovers(cluster.run_id)
    assert seconds >= 0.8 * size / 2.5e6, seconds  # 4 MiB at 2.5 MB/s: 1.7 s at least
    assert size <= moved["head"]["tx_bytes"] <= 1.1 * size and size <= moved["trainer"]["rx_bytes"] <= 1.1 * size


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_leaves_no_namespace_behind(sig):
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "benchmarks", "netcluster.py"), "--no-ray", "--nodes", "head",
                             "trainer", "--gbps", "0.1", "--", "sleep", "60"], stderr=subprocess.PIPE, text=True)
    try:
        prefix = f"{netcluster.PREFIX}-{proc.pid}-"
        deadline = time.monotonic() + 30
        while len(leftovers(prefix)) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        time.sleep(1)  # the command runs
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted; every namespace and process of this run removed" in err
    assert not leftovers(prefix)


# -- a training job, and its trainer node killed ------------------------------------------------------

# Ray's GCS marks a node dead after `health_check_failure_threshold` failed checks, one every
# `health_check_period_ms` (defaults 5 and 3000: about 15 s for a node whose processes died). The test
# cluster checks every second and gives up after 3: a dead node is found in about 3 s, while a live but
# slow raylet (on a loaded 2-core machine) still has 3 timeouts of 10 s each to answer. Test-only
# settings of Ray's own (RAY_<config name> in the nodes' environment); users' clusters keep Ray's.
FAST_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}


def _train(corpus: str, model: str, *extra: str) -> list[str]:
    return ["python", "-m", "doc2vec_dist", "train", "--corpus", corpus, "--out", model, "--dim", "32", "--sample", "0",
            "--num-ps", "2", "--num-workers", "1", "--cpus-per-worker", "1", "--no-progress", *extra]


def _driver_lines(log: str) -> list[str]:
    """The job driver's own lines (not Ray's, which carry a prefix or a date), as `ray job submit` streamed
    them (for a failed job it prints the log's end once more, after "Status message")."""
    streamed = log.split("Status message:")[0]
    return [line for line in streamed.splitlines() if re.match(r"(error|training stopped|interrupted|warning)", line)]


@pytest.mark.slow
def test_a_killed_trainer_node_stops_the_job_with_the_resume_line_and_the_resumed_job_completes(sample_corpus,
                                                                                                  tmp_path):
    from doc2vec_dist import modeldir
    from doc2vec_dist.evaluate import heldout_metrics

    corpus, heldout = sample_corpus
    model = str(tmp_path / "model")
    cluster = netcluster.NetCluster(["head+ps", "trainer"], link_gbps={"trainer": 0.1}, trainer_units=1,
                                    trainer_cpus=1, ps_memory=1536 << 20, object_store=100 << 20,
                                    env={**os.environ, **FAST_DEATH})
    t0 = time.monotonic()
    with cluster:
        t_up = time.monotonic() - t0
        assert [n.gbps for n in cluster.nodes] == [None, 0.1]
        before = cluster.counters()
        with open(tmp_path / "job1.log", "w") as out:
            job = cluster.submit(_train(corpus, model, "--epochs", "200", "--checkpoint-every", "0.5"), output=out)
            deadline = time.monotonic() + 180
            while modeldir.latest_version(model) is None:
                assert job.poll() is None and time.monotonic() < deadline, (tmp_path / "job1.log").read_text()
                time.sleep(0.2)
            t_first = time.monotonic()
            time.sleep(1)
            committed = modeldir.latest_version(model)
            cluster.kill_node("trainer")
            t_kill = time.monotonic()
            job.wait(timeout=120)
        stopped_after = time.monotonic() - t_kill
        log = (tmp_path / "job1.log").read_text()
        lines = _driver_lines(log)
        moved = netcluster.traffic(before, cluster.counters())

        # one error line naming the dead node and what it ran, and the resume command; within Ray's
        # detection (about 3 s for a node whose processes died, with FAST_DEATH) and the driver's check
        assert job.returncode != 0, log[-3000:]
        errors = [line for line in lines if line.startswith("error: ")]
        assert len(errors) == 1, lines
        assert re.match(rf"error: node {re.escape(cluster.node('trainer').address)} \(\w+\) is dead .*: it ran worker 0, "
                        r"which cannot be restarted: .*no live node has trainer; the Ray cluster cannot grow", errors[0])
        version = modeldir.latest_version(model)
        assert version >= committed  # nothing committed is lost
        assert (f"training stopped: the model at {model} is kept up to checkpoint v{version}; resume with "
                f"`doc2vec-dist train --corpus {corpus} --out {model} --resume`") in lines
        assert stopped_after < 60, stopped_after
        _, manifest = modeldir.load_manifest(model)
        done = manifest["epoch"]
        assert modeldir.ModelDir(model).read_table("docs").shape == (5000, 32)

        # the capped link carried the run, within its rate (0.1 Gbit/s), from the job's start to the kill
        link = moved["trainer"]["tx_bytes"] + moved["trainer"]["rx_bytes"]
        assert link > 1e6 and max(moved["trainer"].values()) <= 0.1e9 / 8 * (t_kill - t0 + 5), moved

        # a trainer node again (a fresh one at the same address), and the job resumed: it completes
        cluster.start_node("trainer")
        rc, log2 = cluster.run_job(_train(corpus, model, "--resume", "--epochs", str(done + 3)),
                                   str(tmp_path / "job2.log"), timeout=240)
        assert rc == 0, log2[-3000:]
    assert not leftovers(cluster.run_id)
    _, manifest = modeldir.load_manifest(model)
    assert manifest["epoch"] == done + 3
    with open(os.path.join(model, "config.json")) as fh:
        assert json.load(fh)["summary"]["resumed_from_epoch"] == done
    m = heldout_metrics(model, heldout)
    assert m["model_recall@10"] > 1.15 * m["popularity_recall@10"], m
    print(f"\ncluster up {t_up:.0f}s, first checkpoint {t_first - t0:.0f}s, stopped {stopped_after:.1f}s after the "
          f"kill at epoch {done}, trainer link {link / 1e6:.1f} MB; total {time.monotonic() - t0:.0f}s")
