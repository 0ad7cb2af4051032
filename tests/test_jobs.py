"""jobs/train.py as a user runs it: in-process on the session Ray, and through `ray job submit`
to a real Ray head with token authentication on."""

import contextlib
import json
import os
import re
import secrets
import shlex
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
from conftest import assert_same_corpus, load_benchmark, load_job

from doc2vec_dist.config import PrepareConfig, TrainConfig
from doc2vec_dist.prepare import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_CONFIG = os.path.join(ROOT, "jobs", "configs", "sample.yaml")


def job_config(tmp_path, **overrides) -> str:
    with open(SAMPLE_CONFIG) as fh:
        config = yaml.safe_load(fh)
    config.update({"input": [os.path.join(ROOT, "data", "sample", "events")], "corpus": str(tmp_path / "corpus"),
                   "out": str(tmp_path / "model"), "exports": str(tmp_path / "exports"),
                   "holdout_out": str(tmp_path / "heldout.parquet"), "epochs": 3, "dim": 16, **overrides})
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


def job_in_a_copy(root, monkeypatch, name: str = "train"):
    """jobs/NAME.py loaded from a copy of the checkout's jobs/ under `root` (its data/ the checkout's, read
    only): the sample's runs/sample/ is then root's, and a test never writes the checkout's."""
    import importlib.util

    shutil.copytree(os.path.join(ROOT, "jobs"), os.path.join(root, "jobs"))
    os.symlink(os.path.join(ROOT, "data"), os.path.join(root, "data"))
    monkeypatch.setattr(sys, "path", list(sys.path))  # the job puts its root first; undone after the test
    spec = importlib.util.spec_from_file_location(f"{name}_copy_job", os.path.join(root, "jobs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def some_users_events(path, users: int = 300) -> list[str]:
    """The first `users` users' events of the bundled sample, as one Parquet file at `path`; their keys."""
    import pyarrow as pa
    import pyarrow.compute as pc

    events = pq.read_table(os.path.join(ROOT, "data", "sample", "events"))
    keys = sorted(set(events.column("user_id").to_pylist()))[:users]
    pq.write_table(events.filter(pc.is_in(events.column("user_id"), value_set=pa.array(keys))), str(path))
    return keys


def test_input_trains_on_those_events_with_the_librarys_defaults_not_the_samples(ray_cluster, sample_corpus,
                                                                                tmp_path, monkeypatch, snapshot,
                                                                                capsys):
    """Issue 47, item 1: with the sample prepared (the README's first command), `jobs/train.py --input MINE
    --out T` printed `corpus: using runs/sample/corpus`, trained the sample at the sample's dim 64 and wrote the
    sample's exports. It trains MINE, with the library's defaults, and leaves runs/sample as it was."""
    from doc2vec_dist.checkpoint import ModelDir
    from doc2vec_dist.config import TrainConfig

    checkout = tmp_path / "checkout"
    job = job_in_a_copy(str(checkout), monkeypatch)
    shutil.copytree(sample_corpus[0], checkout / "runs" / "sample" / "corpus")
    sample_before = snapshot(str(checkout / "runs" / "sample"))
    mine = tmp_path / "mine.parquet"
    keys = some_users_events(mine)
    out = tmp_path / "t" / "model"
    assert job.main(["--input", str(mine), "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "config: none (the library's defaults" in err.splitlines()[0], err
    assert snapshot(str(checkout / "runs" / "sample")) == sample_before
    model = ModelDir(str(out))
    assert sorted(model.keys("docs").to_pylist()) == keys
    defaults = TrainConfig()
    assert (model.config().dim, model.config().sample, model.config().epochs) == (defaults.dim, defaults.sample,
                                                                                  defaults.epochs)
    assert json.loads((tmp_path / "t" / "model-corpus" / "corpus.json").read_text())["input_files"] == [str(mine)]
    assert (out / "exports" / "users.index" / "index.faiss").exists()


def test_the_job_says_which_config_it_took_and_input_brings_none_of_the_samples(tmp_path, capsys):
    """Issue 47, item 1: the sample's config applies only when no --input, --corpus or --out is given, and a
    line of its own says which config the job took. With --input the settings are the library's defaults and
    every output is derived from --out: nothing of the sample's (dim 64, sample 0, holdout 0.2, its paths)."""
    job = load_job("train")
    found, prep, cfg, _ = job.parse([])
    assert capsys.readouterr().err.splitlines() == [
        "config: jobs/configs/sample.yaml, the bundled sample's (`--input EVENTS --out DIR` trains on yours)"]
    assert (found.out, cfg.dim, prep.holdout) == (os.path.join(ROOT, "runs", "sample", "model"), 64, 0.2)

    mine = tmp_path / "my.yaml"
    mine.write_text(yaml.safe_dump({"corpus": str(tmp_path / "c"), "out": str(tmp_path / "m"), "dim": 8}))
    job.parse(["--config", str(mine)])
    assert capsys.readouterr().err.splitlines() == [f"config: {mine}"]

    found, prep, cfg, _ = job.parse(["--input", "events.parquet", "--out", "m"])
    assert capsys.readouterr().err.splitlines() == [
        "config: none (the library's defaults, and the flags given)"]
    cwd = os.getcwd()
    assert (found.input, found.out, found.corpus, found.exports) == (
        [os.path.join(cwd, "events.parquet")], os.path.join(cwd, "m"), os.path.join(cwd, "m-corpus"),
        os.path.join(cwd, "m", "exports"))
    assert (prep.holdout, prep.holdout_out, prep.time_col, found.overwrite) == (0.0, None, None, False)
    assert (cfg.dim, cfg.sample, cfg.num_ps) == (TrainConfig().dim, TrainConfig().sample, TrainConfig().num_ps)
    # held out on request: the file goes beside the model too
    _, prep, _, _ = job.parse(["--input", "events.parquet", "--out", "m", "--holdout", "0.1"])
    assert prep.holdout_out == os.path.join(cwd, "m-heldout.parquet")


def test_a_corpus_found_at_the_path_is_checked_against_the_inputs_asked_for(ray_cluster, sample_corpus, tmp_path,
                                                                             monkeypatch, snapshot, capsys):
    """Issue 47, item 1: a corpus prepared from other inputs or settings is never reused. The sample config with
    its `input:` edited prepares the sample's corpus again (the job's own path, and the sample config says
    overwrite); a corpus at a path the user named is refused in one line, naming what differs."""
    checkout = tmp_path / "checkout"
    job = job_in_a_copy(str(checkout), monkeypatch)
    shutil.copytree(sample_corpus[0], checkout / "runs" / "sample" / "corpus")
    mine = tmp_path / "mine.parquet"
    keys = some_users_events(mine, users=200)
    sample_yaml = checkout / "jobs" / "configs" / "sample.yaml"
    config = yaml.safe_load(sample_yaml.read_text())
    sample_yaml.write_text(yaml.safe_dump({**config, "input": [str(mine)], "epochs": 2, "dim": 8}))
    assert job.main(["--no-progress"]) == 0
    err = capsys.readouterr().err
    corpus = checkout / "runs" / "sample" / "corpus"
    assert (f"corpus: {corpus} was prepared from other inputs ({os.path.join(ROOT, 'data', 'sample', 'events')}"
            in err), err
    meta = json.loads((corpus / "corpus.json").read_text())
    assert meta["input_files"] == [str(mine)] and meta["num_docs"] == len(keys)

    # the same inputs and settings again: reused as it is
    prepared = snapshot(str(corpus))
    assert job.main(["--no-progress"]) == 0
    assert f"corpus: using {corpus}" in capsys.readouterr().err
    assert snapshot(str(corpus)) == prepared

    # a corpus the user named, prepared otherwise: refused, untouched, whatever --overwrite says
    theirs = shutil.copytree(sample_corpus[0], tmp_path / "theirs")
    before = snapshot(str(theirs))
    for extra in ([], ["--overwrite"]):
        assert job.main(["--input", str(mine), "--corpus", str(theirs), "--out", str(tmp_path / "m"),
                         "--no-progress", *extra]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and errors[0].startswith(f"error: {theirs}: prepared from other inputs "), errors
    assert snapshot(str(theirs)) == before and not (tmp_path / "m").exists()
    # settings other than those it was prepared with are named, each (the sample's, against the defaults here)
    assert job.main(["--corpus", str(corpus), "--out", str(tmp_path / "m"), "--input", str(mine),
                     "--min-count", "2", "--no-progress"]) == 2
    assert (f"error: {corpus}: prepared with time_col ts, not none; min_count 1, not 2; holdout 0.2, not 0.0; "
            f"holdout_out {checkout / 'runs' / 'sample' / 'heldout.parquet'}, not none; name another corpus "
            "(--corpus), or remove this one") in capsys.readouterr().err


def nodes_die_after_the_first_checkpoint(monkeypatch, model: str):
    """Ray's view of the nodes, as the driver asks for it, turned (as tests/test_faults.py turns it): once
    `model` has a checkpoint, every node is reported dead, on a cluster that cannot grow, so the run stops at
    the driver's next check, keeping that checkpoint. Returns the switch that brings the nodes back."""
    import ray

    from doc2vec_dist import checkpoint, trainer

    real_nodes, alive = ray.nodes, [False]

    def nodes():
        found = real_nodes()
        if alive[0] or checkpoint.latest_version(model) is None:
            return found
        return [{**n, "Alive": False, "DeathReasonMessage": "health check failed due to missing too many heartbeats"}
                for n in found]

    monkeypatch.setattr(ray, "nodes", nodes)
    monkeypatch.setattr(trainer, "cluster_can_grow", lambda: False)
    monkeypatch.setattr(trainer, "NODE_CHECK_SECONDS", 0.02)
    return lambda: alive.__setitem__(0, True)


def test_a_job_stopped_by_a_dead_node_names_its_own_resume_which_finishes_the_job(ray_cluster, sample_corpus,
                                                                                   tmp_path, monkeypatch, capsys):
    """Issue 47, item 11: after a node died the job said `doc2vec-dist train --corpus … --out … --resume`,
    which leaves its export, index and evaluate undone. It names itself, with the arguments it was given, and
    that command resumes the model from its checkpoint and then does the rest of the job."""
    from doc2vec_dist import checkpoint

    job = load_job("train")
    corpus, heldout = sample_corpus  # the sample's settings with its held-out file: the job uses it as it is
    config = job_config(tmp_path, corpus=corpus, holdout_out=heldout, epochs=30, checkpoint_every=0.05)
    model = str(tmp_path / "model")
    bring_back = nodes_die_after_the_first_checkpoint(monkeypatch, model)
    argv = ["--config", config, "--no-progress"]
    assert job.main(argv) == 2
    err = capsys.readouterr().err
    version = checkpoint.latest_version(model)
    _, manifest = checkpoint.load_manifest(model)
    assert version is not None and manifest["epoch"] < 30, err
    resume = re.search(rf"training stopped: the model at {re.escape(model)} is kept up to checkpoint v{version}; "
                       r"resume with `(\S+) (\S+) (.+)`$", err, re.MULTILINE)
    assert resume, err
    python, script, args = resume.groups()
    assert script.endswith("train.py"), resume.group(0)
    assert os.path.samefile(python, sys.executable) and os.path.samefile(script, os.path.join(ROOT, "jobs", "train.py"))
    assert args == f"--config {config} --no-progress --resume"
    assert not (tmp_path / "exports").exists()

    bring_back()
    assert job.main(shlex.split(args)) == 0
    assert f"resumed from v{version}" in capsys.readouterr().err
    _, manifest = checkpoint.load_manifest(model)
    assert manifest["epoch"] == 30
    result = check_outputs(tmp_path)
    assert "evaluate" in result["stages"] and result["heldout"]["users"] > 4000


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
