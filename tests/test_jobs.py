"""jobs/train.py as a user runs it: in-process on the session Ray, and through `ray job submit`
to a real Ray head with token authentication on."""

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

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import assert_same_corpus, load_benchmark, load_job

from doc2vec_dist.config import PrepareConfig, TrainConfig
from doc2vec_dist.prepare import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_CONFIG = os.path.join(ROOT, "jobs", "configs", "sample.yaml")


def job_config(tmp_path, **overrides) -> str:
    with open(SAMPLE_CONFIG) as fh:
        config = yaml.safe_load(fh)
    config.update(input=[os.path.join(ROOT, "data", "sample", "events")], corpus=str(tmp_path / "corpus"),
                  out=str(tmp_path / "model"), exports=str(tmp_path / "exports"),
                  holdout_out=str(tmp_path / "heldout.parquet"), epochs=3, dim=16, **overrides)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def check_outputs(base, dim=16):
    users = pq.read_table(base / "exports" / "users.parquet")
    assert users.num_rows == 5000 - users.num_rows % 5000 or users.num_rows > 4900
    assert users.schema.field("vector").type.list_size == dim
    assert (base / "exports" / "users.index" / "index.faiss").exists()
    assert pq.read_table(base / "exports" / "urls.parquet").num_rows > 4000
    result = json.loads((base / "exports" / "job.json").read_text())
    assert set(result["stages"]) >= {"prepare", "train", "export", "index"}
    assert len(result["example"]["similar_users"]) == 5
    return result


def test_job_runs_prepare_train_export_index_in_process(ray_cluster, tmp_path, capsys):
    """On the session's Ray, prepare's passes ran as Ray tasks on its 2 CPUs (issue 30, item 5), and
    made the corpus and held-out file that one process makes."""
    assert load_job("train").main(["--config", job_config(tmp_path), "--no-progress"]) == 0
    check_outputs(tmp_path)
    out = capsys.readouterr().out
    assert "held-out recall@10: model" in out and "similar users" in out
    meta = json.loads((tmp_path / "corpus" / "corpus.json").read_text())
    assert meta["parallel"] == 2
    settings = {k: meta[k] for k in ("time_col", "min_count", "holdout", "seed")}
    single = str(tmp_path / "single")
    prepare(meta["inputs"], single, PrepareConfig(**settings, holdout_out=single + ".parquet"), progress=False)
    assert_same_corpus(single, str(tmp_path / "corpus"), heldout=(single + ".parquet", str(tmp_path / "heldout.parquet")))


def test_a_job_prepares_on_the_cluster_it_runs_on(monkeypatch):
    """jobs/train.py and jobs/refresh.py prepare with Ray tasks on every CPU of the cluster they run
    on (an address, RAY_ADDRESS as `ray job submit` sets it, a Ray already connected), unless
    --parallel says otherwise; on one machine with no Ray, in their own process."""
    import ray

    job = load_job("train")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    train = TrainConfig(seed=7)
    alone = job.on_cluster(PrepareConfig(), train)
    assert (alone.parallel, alone.address, alone.seed) == (None, None, 7)
    assert job.on_cluster(PrepareConfig(), TrainConfig(address="10.0.0.1:6379")).parallel == 0
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    submitted = job.on_cluster(PrepareConfig(), train)
    assert (submitted.parallel, submitted.address) == (0, "10.0.0.2:6379")
    assert job.on_cluster(PrepareConfig(parallel=3), train).parallel == 3
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    assert job.on_cluster(PrepareConfig(), train).parallel == 0


def test_job_reuses_a_prepared_corpus_and_flags_override_yaml(ray_cluster, tmp_path, capsys):
    job = load_job("train")
    config = job_config(tmp_path)
    assert job.main(["--config", config, "--no-progress"]) == 0
    assert job.main(["--config", config, "--no-progress", "--dim", "24"]) == 0
    assert "corpus: using" in capsys.readouterr().err
    assert json.loads((tmp_path / "model" / "config.json").read_text())["dim"] == 24


def test_job_reports_a_bad_config_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("epochz: 3\n")
    assert load_job("train").main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "unknown config key(s): epochz" in err and str(bad) in err


def test_the_job_takes_an_init_from_models_shape_as_train_does(trained_model, tmp_path):
    """Issue 26, item 8: jobs/train.py --init-from takes the model's dim (32 here) like train --init-from;
    the config's own dim, when it says another, is refused naming the file."""
    job = load_job("train")
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"corpus": str(tmp_path / "corpus"), "out": str(tmp_path / "model"), "epochs": 1}))
    _, _, cfg, _ = job.parse(["--config", str(config), "--init-from", trained_model])
    assert (cfg.dim, cfg.mode, cfg.init_from) == (32, "dbow", trained_model)
    with pytest.raises(job.UserError, match=rf"^{job_config(tmp_path)}: dim: 16 contradicts the --init-from model "):
        job.parse(["--config", job_config(tmp_path), "--init-from", trained_model])


@pytest.mark.parametrize("entry", ["jobs/train.py", "jobs/refresh.py", "jobs/tune.py", "jobs/export.py",
                                   "jobs/index.py", "-m doc2vec_dist"])
def test_a_python_without_the_projects_packages_gets_one_line_that_says_so(entry):
    """Issue 26, item 10: a head started without the venv active runs a job's `python` from PATH, and the
    job died in `ModuleNotFoundError: No module named 'pyarrow'`. This Python with -S (no site-packages)
    stands in for that one."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = ROOT if entry.startswith("-m") else ""  # the job scripts find the package themselves
    done = subprocess.run([sys.executable, "-S", *entry.split(), "--help"], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=60, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: this Python ({sys.executable}) lacks torch, gensim, pyarrow, ray, ")
    assert "start Ray with the project's venv active (`source .venv/bin/activate`, then `ray start ...`)" in lines[0]


def test_the_packages_checked_are_the_projects_dependencies():
    import re

    from doc2vec_dist.environment import REQUIRED, missing_packages

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        dependencies = tomllib.load(fh)["project"]["dependencies"]
    declared = {re.split(r"[<>=!~\[; ]", r)[0].lower() for r in dependencies}
    assert {name.lower() for name in REQUIRED.values()} == declared
    assert missing_packages() == []


def test_a_config_of_training_keys_only_runs_on_the_sample(capsys):
    """`python jobs/train.py --config jobs/configs/fast.yaml` (then a recipe of training keys) crashed with a
    TypeError on the unset corpus; a config with no input, corpus or out now runs on the bundled sample,
    with its own model."""
    job, prep, cfg, _ = load_job("train").parse(["--config", os.path.join(ROOT, "jobs", "configs", "gpu.yaml")])
    assert job.input == [os.path.join(ROOT, "data", "sample", "events")]
    assert job.corpus == os.path.join(ROOT, "runs", "sample", "corpus")  # shared with the sample's run
    assert job.out == os.path.join(ROOT, "runs", "gpu", "model")  # but a model of its own
    assert job.exports == os.path.join(ROOT, "runs", "gpu", "exports")
    assert prep.holdout_out == os.path.join(ROOT, "runs", "sample", "heldout.parquet") and prep.time_col == "ts"
    assert (cfg.gpus_per_worker, cfg.micro_batch, cfg.dim) == (1, 8192, 100)  # gpu.yaml's own keys win
    assert "gpu.yaml sets no input, corpus or out: running it on the bundled sample" in capsys.readouterr().err


def test_relative_outputs_inside_a_submitted_job_need_a_root(tmp_path, monkeypatch):
    """Under `ray job submit --working-dir`, the working dir is a temporary copy: a relative output there
    vanishes with the job, so it is refused, and --root puts relative outputs where they last."""
    job_mod = load_job("train")
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_x.zip"}}))
    with pytest.raises(job_mod.UserError, match=r"sample.yaml: 'corpus' is the relative path runs/sample/corpus, "
                                                r"which inside `ray job submit --working-dir` lands in Ray's temporary"):
        job_mod.parse(["--config", SAMPLE_CONFIG])
    with pytest.raises(job_mod.UserError, match="--root rel: give an absolute path"):
        job_mod.parse(["--config", SAMPLE_CONFIG, "--root", "rel"])
    job, prep, _, _ = job_mod.parse(["--config", SAMPLE_CONFIG, "--root", str(tmp_path)])
    assert (job.corpus, job.out, job.exports, prep.holdout_out) == tuple(
        str(tmp_path / "runs" / "sample" / name) for name in ("corpus", "model", "exports", "heldout.parquet"))
    assert job.input == [os.path.join(ROOT, "data", "sample", "events")]  # inputs come with the upload
    # absolute paths need no root; outside a submitted job nothing changes
    job, _, _, _ = job_mod.parse(["--config", SAMPLE_CONFIG, "--corpus", "/data/c", "--out", "/data/m",
                                  "--exports", "/data/e", "--holdout-out", "/data/h.parquet"])
    assert (job.corpus, job.out) == ("/data/c", "/data/m")
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    job, _, _, _ = job_mod.parse(["--config", SAMPLE_CONFIG])
    assert job.out == os.path.join(ROOT, "runs", "sample", "model")


@pytest.mark.slow
def test_ray_job_submit_with_token_auth_and_a_leftover_ray_start(tmp_path, sample_corpus):
    """A real head (token auth on, dashboard on loopback), started the way a user's leftover `ray start`
    is: it records itself as this machine's current cluster. Then, as the README does:
    - a local run with no address starts a Ray of its own and never joins that head (it died with
      'object_store_memory must not be provided' when it did);
    - `ray job submit --working-dir . ... --config jobs/configs/sample.yaml` refuses its relative
      outputs, which would land in Ray's temporary copy of the working dir, in one line;
    - with --root, the job writes the model and exports under that root, where they last.
    """
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    tmp_root = tempfile.mkdtemp(prefix="rayt", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    # RAY_TMPDIR, not --temp-dir: the head then writes ray_current_cluster where a plain ray.init() of a
    # process with the same environment looks for a running cluster, as with a default `ray start`
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16), "RAY_TMPDIR": tmp_root}
    env.pop("RAY_ADDRESS", None)
    log = os.path.join(tmp_root, "head.log")

    def start_head():
        with contextlib.ExitStack() as held:  # seven distinct ports: each socket held until all are picked
            sockets = [held.enter_context(socket.socket()) for _ in range(7)]
            for sock in sockets:
                sock.bind(("127.0.0.1", 0))
            dash, gcs, *agents = [sock.getsockname()[1] for sock in sockets]
        with open(log, "w") as out:
            return dash, subprocess.Popen(
                [ray_bin, "start", "--head", "--block", "--port", str(gcs), "--num-cpus", "2",
                 "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--disable-usage-stats",
                 # own ports for the agents: the session's local Ray already holds the default ones
                 *(arg for flag, port in zip(("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                                              "--runtime-env-agent-port", "--metrics-export-port",
                                              "--ray-client-server-port"), agents) for arg in (flag, str(port)))],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    dash, head = start_head()
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.time() + 90
        current = os.path.join(tmp_root, "ray", "ray_current_cluster")
        # `ray start` records the cluster only after the node is up, so the dashboard can answer first
        retries = 2  # a free port picked here can be taken by the other test process before Ray binds it
        while not os.path.exists(current) or subprocess.run(
                [ray_bin, "job", "list", "--address", address], env=env, capture_output=True,
                check=False).returncode != 0:
            if head.poll() is not None:
                with open(log) as fh:
                    said = fh.read()
                assert retries and "port" in said.lower(), f"Ray head did not come up: {said[-2000:]}"
                retries -= 1
                dash, head = start_head()
                address = f"http://127.0.0.1:{dash}"
            assert time.time() < deadline, "Ray head did not come up in 90 s"
            time.sleep(2)
        no_token = {**env, "RAY_AUTH_TOKEN": "wrong-token"}
        refused = subprocess.run([ray_bin, "job", "list", "--address", address], env=no_token,
                                 capture_output=True, text=True, check=False)
        assert refused.returncode != 0  # token auth is really on

        local = subprocess.run([sys.executable, "-m", "doc2vec_dist", "train", "--corpus", sample_corpus[0],
                                "--out", str(tmp_path / "local"), "--epochs", "1", "--dim", "8", "--no-progress"],
                               env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
        assert local.returncode == 0, local.stderr[-3000:]
        assert f"model: {tmp_path / 'local'} (checkpoint v1)" in local.stdout
        actors = subprocess.run([ray_bin, "list", "actors", "--address", address, "--format", "json"], env=env,
                                capture_output=True, text=True, check=False)
        assert "ParameterServer" not in actors.stdout and "Worker" not in actors.stdout  # never joined the head

        def submit(*args: str) -> subprocess.CompletedProcess:
            for _ in range(15):  # the job API answers before the node's agent can take a job: retry that
                done = subprocess.run(
                    [ray_bin, "job", "submit", "--address", address, "--working-dir", ROOT, "--",
                     sys.executable, "jobs/train.py", "--config", SAMPLE_CONFIG, "--no-progress", *args],
                    env=env, capture_output=True, text=True, timeout=300, check=False)
                if "No available agent" not in done.stdout + done.stderr:
                    return done
                time.sleep(2)
            return done

        done = submit()
        assert done.returncode != 0
        assert "error: " + SAMPLE_CONFIG + ": 'corpus' is the relative path runs/sample/corpus, which inside " \
               "`ray job submit --working-dir` lands in Ray's temporary copy" in done.stdout + done.stderr
        done = submit("--root", str(tmp_path), "--epochs", "3", "--dim", "16")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "succeeded" in done.stdout + done.stderr
        check_outputs(tmp_path / "runs" / "sample")
        assert f"outputs: model {tmp_path / 'runs' / 'sample' / 'model'}" in done.stdout + done.stderr
    finally:
        # the head and everything it started share its process group; a graceful SIGTERM drains for
        # 30 s, so stop them hard, then sweep anything that left the group (its command names tmp_root)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=60)
        subprocess.run(["pkill", "-9", "-f", tmp_root], check=False)
        shutil.rmtree(tmp_root, ignore_errors=True)


def test_feed_rate_times_one_worker_with_and_without_the_kernel(ray_cluster, sample_corpus, tmp_path, capsys):
    from doc2vec_dist.corpus import Corpus

    feed_rate = load_benchmark("feed_rate")
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


def test_feed_rate_without_ray_runs_the_device_token_path_against_servers_in_the_process(sample_corpus, tmp_path,
                                                                                        capsys):
    from doc2vec_dist.corpus import Corpus

    feed_rate = load_benchmark("feed_rate")
    config = tmp_path / "batched.yaml"
    config.write_text("kernel: batched\n")
    out = tmp_path / "feed.json"
    assert feed_rate.main(["--corpus", sample_corpus[0], "--config", str(config), "--no-ray", "--json", str(out)]) == 0
    assert "2 PS (in this process)" in capsys.readouterr().out
    with open(out) as fh:
        bare, real = json.load(fh)["runs"]
    tokens = Corpus(sample_corpus[0]).num_tokens
    assert bare["tokens"] == real["tokens"] == tokens and bare["servers"] == "in this process"
    assert bare["macro_batch"] == 1_048_576  # the device token path's default
    assert bare["worker_seconds"]["compute"] < real["worker_seconds"]["compute"]


def test_feed_rate_runs_the_gpu_workers_path_on_the_cpu_and_its_epochs_move_no_bytes(sample_corpus, tmp_path, capsys):
    """Issue 48: --device cpu runs the GPU worker's path (staged, the batched kernel) where there is no GPU.
    Its documents' and URL rows stay on the device across epochs: an epoch moves nothing to or from the
    servers, and a checkpoint's write-back, timed apart, carries every row it holds."""
    from doc2vec_dist.corpus import Corpus

    feed_rate = load_benchmark("feed_rate")
    out = tmp_path / "feed.json"
    assert feed_rate.main(["--corpus", sample_corpus[0], "--config", os.path.join(ROOT, "jobs/configs/gpu.yaml"),
                           "--device", "cpu", "--no-ray", "--no-kernel-only", "--json", str(out)]) == 0
    assert "a checkpoint's write-back of the rows kept resident" in capsys.readouterr().out
    with open(out) as fh:
        (bare,) = json.load(fh)["runs"]
    corpus = Corpus(sample_corpus[0])
    assert bare["staged"] and bare["tokens"] == corpus.num_tokens
    assert set(bare["bytes_per_token"].values()) == {0}
    assert bare["write_back_bytes"] == (corpus.num_docs + corpus.vocab_size) * 100 * 4  # gpu.yaml: dim 100


def test_gpu_bench_through_ray_trains_what_it_trains_in_process_and_shares_the_device(ray_cluster, sample_corpus,
                                                                                     tmp_path, capsys):
    """Issue 48: gpu_bench.py --ray trains as `train` does (servers and workers Ray actors, checkpoints at each
    epoch's end): one worker the model of the in-process bench, bit for bit, with no bytes a token after its
    first pulls but each checkpoint's write-back; --workers 2 shares the device on the block schedule."""
    from doc2vec_dist import checkpoint

    gpu_bench = load_benchmark("gpu_bench")
    config = tmp_path / "small.yaml"
    config.write_text("dim: 16\nsample: 0\n")
    runs = {}
    for name, extra in (("in-process", []), ("ray", ["--ray"]), ("ray2", ["--ray", "--workers", "2"])):
        out = tmp_path / f"{name}.json"
        assert gpu_bench.main(["--corpus", sample_corpus[0], "--heldout", sample_corpus[1], "--config", str(config),
                               "--device", "cpu", "--epochs", "3", "--out", str(tmp_path / name), "--json", str(out),
                               *extra]) == 0
        with open(out) as fh:
            runs[name] = json.load(fh)
    assert "2 worker(s) on cpu through Ray" in capsys.readouterr().out
    assert [len(r["epochs"]) for r in runs.values()] == [3, 3, 3]
    assert runs["ray2"]["workers"] == 2 and runs["ray2"]["config"]["schedule"] == "auto"
    for table in ("docs", "words_out"):
        np.testing.assert_array_equal(checkpoint.ModelDir(str(tmp_path / "ray")).read_table(table),
                                      checkpoint.ModelDir(str(tmp_path / "in-process")).read_table(table), err_msg=table)
    # one worker: its URL and documents' rows pulled once and written back once an epoch (the checkpoints)
    moved = runs["ray"]["bytes_per_token"]
    assert moved["pulled"] == moved["pushed"] == 0 < moved["resident_pushed"], moved
    assert runs["ray"]["heldout"]["model_recall@10"] == runs["in-process"]["heldout"]["model_recall@10"]


def test_gpu_bench_trains_one_device_worker_without_ray_and_scores_the_model_it_wrote(sample_corpus, tmp_path, capsys):
    """benchmarks/gpu_bench.py with the CPU as the device: the token path's worker against servers in the
    process, a model directory the library reads, and held-out recall above popularity."""
    from doc2vec_dist import Model

    gpu_bench = load_benchmark("gpu_bench")
    config = tmp_path / "small.yaml"
    config.write_text("dim: 32\nsample: 0\n")
    out, model = tmp_path / "bench.json", tmp_path / "model"
    assert gpu_bench.main(["--corpus", sample_corpus[0], "--heldout", sample_corpus[1], "--config", str(config),
                           "--device", "cpu", "--epochs", "10", "--out", str(model), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "one worker on cpu (the token path: examples drawn on the device)" in printed
    with open(out) as fh:
        result = json.load(fh)
    assert len(result["epochs"]) == 10 and result["tokens_per_second"] > 0
    assert result["config"]["kernel"] == "batched" and result["config"]["gpus_per_worker"] == 0
    held = result["heldout"]
    assert held["model_recall@10"] > held["popularity_recall@10"] + 0.03, held
    assert Model(str(model)).table("docs").shape[1] == 32  # a whole model directory, verified as any other
    # an existing model directory is refused unless --overwrite
    assert gpu_bench.main(["--corpus", sample_corpus[0], "--heldout", sample_corpus[1], "--config", str(config),
                           "--device", "cpu", "--epochs", "1", "--out", str(model)]) == 2
    assert "error:" in capsys.readouterr().err
