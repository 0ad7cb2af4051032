"""jobs/train.py as a user runs it: in-process on the session Ray, and through `ray job submit`
to a real Ray head with token authentication on."""

import contextlib
import importlib.util
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
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_CONFIG = os.path.join(ROOT, "jobs", "configs", "sample.yaml")


def load_job(name: str = "train"):
    spec = importlib.util.spec_from_file_location(f"{name}_job", os.path.join(ROOT, "jobs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job_config(tmp_path, **overrides) -> str:
    with open(SAMPLE_CONFIG) as fh:
        config = yaml.safe_load(fh)
    config.update(input=[os.path.join(ROOT, "data", "sample", "events")], corpus=str(tmp_path / "corpus"),
                  out=str(tmp_path / "model"), exports=str(tmp_path / "exports"),
                  holdout_out=str(tmp_path / "heldout.parquet"), epochs=3, dim=16, **overrides)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def check_outputs(tmp_path, dim=16):
    users = pq.read_table(tmp_path / "exports" / "users.parquet")
    assert users.num_rows == 5000 - users.num_rows % 5000 or users.num_rows > 4900
    assert users.schema.field("vector").type.list_size == dim
    assert (tmp_path / "exports" / "users.index" / "index.faiss").exists()
    assert pq.read_table(tmp_path / "exports" / "urls.parquet").num_rows > 4000
    result = json.loads((tmp_path / "exports" / "job.json").read_text())
    assert set(result["stages"]) >= {"prepare", "train", "export", "index"}
    assert len(result["example"]["similar_users"]) == 5
    return result


def test_job_runs_prepare_train_export_index_in_process(ray_cluster, tmp_path, capsys):
    assert load_job().main(["--config", job_config(tmp_path), "--no-progress"]) == 0
    check_outputs(tmp_path)
    out = capsys.readouterr().out
    assert "held-out recall@10: model" in out and "similar users" in out


def test_job_reuses_a_prepared_corpus_and_flags_override_yaml(ray_cluster, tmp_path, capsys):
    job = load_job()
    config = job_config(tmp_path)
    assert job.main(["--config", config, "--no-progress"]) == 0
    assert job.main(["--config", config, "--no-progress", "--dim", "24"]) == 0
    assert "corpus: using" in capsys.readouterr().err
    assert json.loads((tmp_path / "model" / "config.json").read_text())["dim"] == 24


def test_job_reports_a_bad_config_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("epochz: 3\n")
    assert load_job().main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "unknown config key(s): epochz" in err and str(bad) in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ray_job_submit_with_token_auth(tmp_path):
    """A real head (token auth on, dashboard on loopback) and `ray job submit --working-dir .`."""
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    env.pop("RAY_ADDRESS", None)
    dash = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="rayt", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    head = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", "--port", str(_free_port()), "--num-cpus", "2",
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--disable-usage-stats",
         "--temp-dir", temp_dir,
         # own ports for the agents: the session's local Ray already holds the default ones
         "--dashboard-agent-listen-port", str(_free_port()), "--dashboard-agent-grpc-port", str(_free_port()),
         "--runtime-env-agent-port", str(_free_port()), "--metrics-export-port", str(_free_port()),
         "--ray-client-server-port", str(_free_port())],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.time() + 90
        while subprocess.run([ray_bin, "job", "list", "--address", address], env=env,
                             capture_output=True, check=False).returncode != 0:
            assert time.time() < deadline and head.poll() is None, "Ray head did not come up"
            time.sleep(2)
        no_token = {**env, "RAY_AUTH_TOKEN": "wrong-token"}
        refused = subprocess.run([ray_bin, "job", "list", "--address", address], env=no_token,
                                 capture_output=True, text=True, check=False)
        assert refused.returncode != 0  # token auth is really on
        config = job_config(tmp_path)
        for _ in range(15):  # the job API answers before the node's agent can take a job: retry that
            done = subprocess.run(
                [ray_bin, "job", "submit", "--address", address, "--working-dir", ROOT, "--",
                 sys.executable, "jobs/train.py", "--config", config, "--no-progress"],
                env=env, capture_output=True, text=True, timeout=300, check=False)
            if "No available agent" not in done.stdout + done.stderr:
                break
            time.sleep(2)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "succeeded" in done.stdout + done.stderr
        check_outputs(tmp_path)
    finally:
        # the head and everything it started share its process group; a graceful SIGTERM drains for
        # 30 s, so stop them hard, then sweep anything that left the group (its command names temp_dir)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=60)
        subprocess.run(["pkill", "-9", "-f", temp_dir], check=False)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_feed_rate_times_one_worker_with_and_without_the_kernel(ray_cluster, sample_corpus, tmp_path, capsys):
    from doc2vec_dist.corpus import Corpus

    feed_rate = load_job("feed_rate")
    out = tmp_path / "feed.json"
    assert feed_rate.main(["--corpus", sample_corpus[0], "--num-ps", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "no kernel (the feed ceiling)" in text and "kernel on cpu" in text
    with open(out) as fh:
        bare, real = json.load(fh)["runs"]
    tokens = Corpus(sample_corpus[0]).num_tokens
    assert bare["tokens"] == real["tokens"] == tokens  # the timed (last) epoch, whole
    assert not bare["kernel"] and real["kernel"]
    assert bare["worker_seconds"]["compute"] < real["worker_seconds"]["compute"]
    assert bare["tokens_per_second"] > 0 and real["tokens_per_second"] > 0
    # a GPU config on a machine without CUDA is one clear error line
    if not __import__("torch").cuda.is_available():
        assert feed_rate.main(["--corpus", sample_corpus[0], "--config", os.path.join(ROOT, "jobs/configs/gpu.yaml"),
                               "--no-kernel-only"]) == 2
        assert "no CUDA device" in capsys.readouterr().err
