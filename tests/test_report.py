"""What a person looks at (issue 52): the training log a run writes as it goes (MODEL/training.jsonl), the run's
figures in Ray's metrics, and the report page (`doc2vec-dist report`), rendered in a real headless Chromium."""

from __future__ import annotations

import html.parser
import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request

import numpy as np
import pytest

from doc2vec_dist import modeldir, runlog
from doc2vec_dist.cli import main
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.corpus import Corpus
from doc2vec_dist.errors import UserError
from doc2vec_dist.evaluate import heldout_metrics
from doc2vec_dist.metrics import RECORD_SECONDS, RunMetrics
from doc2vec_dist.trainer import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = {"read", "sample", "pull", "wait", "compute", "push", "barrier"}
# the sections every page has, and the figures in them (a page of a model with --heldout)
SECTIONS = ("run", "training", "quality", "space")
FIGURES = ("fig-loss", "fig-throughput", "fig-time-split", "fig-timeline", "fig-recall", "fig-recall-by-activity",
           "fig-map")


def log_of(model: str) -> list[dict]:
    lines, skipped = runlog.read(model)
    assert skipped == 0
    return lines


# -- the training log ----------------------------------------------------------------------------

def test_training_writes_a_line_per_epoch_with_each_workers_time_split(trained_model):
    """The sample model (2 workers, 10 epochs): a start line, ten epoch lines in order with the loss the
    summary gives, tokens/s, bytes and each worker's own split, a checkpoint line, an end line."""
    lines = log_of(trained_model)
    assert lines[0]["event"] == "start" and lines[-1]["event"] == "end"
    assert len({line["run"] for line in lines}) == 1
    epochs = [line for line in lines if line["event"] == "epoch"]
    assert [e["epoch"] for e in epochs] == list(range(1, 11))
    summary = modeldir.ModelDir(trained_model).settings()["summary"]
    np.testing.assert_allclose([e["loss"] for e in epochs], summary["loss_per_epoch"], rtol=1e-9)
    assert sum(e["tokens"] for e in epochs) == summary["tokens"]
    for e in epochs:
        assert e["tokens_per_second"] > 0 and e["wall_seconds"] > 0 and sum(e["bytes"].values()) > 0
        assert [w["worker"] for w in e["workers"]] == [0, 1]
        assert sum(w["tokens"] for w in e["workers"]) == e["tokens"]
        for w in e["workers"]:
            assert set(w["seconds"]) == STAGES and w["tokens_per_second"] > 0 and sum(w["bytes"].values()) > 0
    assert [c["version"] for c in lines if c["event"] == "checkpoint"] == list(range(1, 11))  # one per epoch
    assert lines[0]["resumed_from"] is None and lines[0]["config"]["num_workers"] == 2


def test_a_resumed_run_appends_to_the_log_and_the_metrics_reach_rays_endpoint(ray_cluster, small_corpus, tmp_path):
    """While a run trains, Ray's metrics endpoint of this node serves its tokens/s for each worker (recorded by
    the driver); a resumed run appends its own lines, its start line naming the version it resumed from."""
    model = str(tmp_path / "model")
    config = TrainConfig(dim=16, epochs=2, sample=0, num_ps=2, num_workers=2, cpus_per_worker=1, progress=False)
    port = next(n["MetricsExportPort"] for n in ray_cluster.nodes() if n["Alive"])
    found: dict[str, float] = {}
    done = threading.Event()

    def scrape() -> None:  # until the run's two workers are both seen, or a minute after it ended
        deadline = None
        while len(found) < 2:
            if done.is_set():
                deadline = deadline or time.monotonic() + 60
                if time.monotonic() > deadline:
                    return
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                text = ""
            for line in text.splitlines():
                match = re.match(r"ray_doc2vec_dist_tokens_per_second\{(.*)\} (\S+)$", line)
                if match and f'model="{model}"' in match.group(1):
                    worker = re.search(r'worker="(\d+)"', match.group(1)).group(1)
                    found[worker] = float(match.group(2))
            time.sleep(0.5)

    reader = threading.Thread(target=scrape)
    reader.start()
    try:
        train(small_corpus, model, config)
    finally:
        done.set()
        reader.join()
    assert set(found) == {"0", "1"} and all(v > 0 for v in found.values()), found

    first = log_of(model)
    train(small_corpus, model, TrainConfig(**{**config.__dict__, "epochs": 3, "resume": True}))
    lines = log_of(model)
    assert lines[:len(first)] == first  # appended: the first run's lines as they were
    starts = [line for line in lines if line["event"] == "start"]
    assert len(starts) == 2 and starts[0]["resumed_from"] is None and starts[1]["resumed_from"] == 2
    assert starts[0]["run"] != starts[1]["run"]
    assert [line["epoch"] for line in lines if line["event"] == "epoch"] == [1, 2, 3]
    assert [line["event"] for line in lines].count("end") == 2
    # the page's Duration is every run's: it showed the resumed run's summary alone (its tokens, its seconds)
    from doc2vec_dist.report import report

    page = str(tmp_path / "page.html")
    report(model, page, sample=50)
    with open(page) as fh:
        text = fh.read()
    every = sum(line["tokens"] for line in lines if line["event"] == "epoch")
    assert every == 3 * Corpus(small_corpus).num_tokens
    assert f"<td>tokens</td><td>{every:,}</td>" in text, text[text.find("Duration"):][:800]
    assert "training, every run&#x27;s epochs" in text and "start-up, the last run&#x27;s" in text


def test_the_metrics_tell_ray_every_few_seconds_not_every_tick_and_lose_no_rows(monkeypatch):
    """What training pays for its metrics (issue 52's ≤1%): 20 simulated seconds of 40 ms rounds, each tick's
    progress fed to the metrics, call Ray (a gauge set, a counter increased) and ask the servers only every
    RECORD_SECONDS, not per tick or round; the counters still add up to every row moved, and the run's end
    tells Ray the last figures."""
    from ray.util.metrics import Counter, Gauge

    calls: list[tuple[str, float, dict]] = []
    monkeypatch.setattr(Gauge, "set", lambda self, value, tags=None: calls.append((self._name, value, tags)))
    monkeypatch.setattr(Counter, "inc", lambda self, value=1.0, tags=None: calls.append((self._name, value, tags)))
    row_bytes = 128
    metrics = RunMetrics("model", "run", row_bytes)
    step, rounds, per_round = 0.02, 500, 2  # a tick every 20 ms, two ticks a round, a round an epoch
    pulled = asked = 0
    for r in range(rounds):
        for tick in range(1, per_round + 1):
            now = (r * per_round + tick) * step
            answer = {"epoch": r, "round": 0, "tokens": 1000 * tick, "pairs": 500 * tick, "loss": 0.5 * tick,
                      "bytes": {"pulled": 10 * row_bytes * tick, "resident_pulled": row_bytes * tick}}
            metrics.workers({0: answer, 1: answer}, now=now)
            if metrics.servers_due(now):
                asked += 1
                metrics.servers({0: {"pid": 7, "apply_seconds": now / 10, "pull_seconds": now / 20}})
            metrics.record(now)
        pulled += 2 * 11 * per_round  # both workers' rows of the round (each call's counters start from 0)
    metrics.position(rounds - 1, 0)
    metrics.flush(rounds * per_round * step)
    seconds = rounds * per_round * step
    assert asked <= seconds / RECORD_SECONDS + 1, asked
    # the old code called Ray about ten times a tick (2,000 ticks)
    assert len(calls) <= (seconds / RECORD_SECONDS + 1) * 10, len(calls)
    assert sum(v for name, v, _ in calls if name == "doc2vec_dist_rows_pulled") == pytest.approx(pulled)
    rates = [(v, tags["worker"]) for name, v, tags in calls if name == "doc2vec_dist_tokens_per_second"]
    assert {w for _, w in rates} == {"0", "1"} and all(v > 0 for v, _ in rates)
    assert ("doc2vec_dist_epoch", rounds - 1, {"model": "model", "run": "run"}) in calls


def test_the_overhead_benchmark_counts_the_cpu_of_a_command_and_what_runs_under_it_by_kind():
    """benchmarks/records_overhead.py bounds the records' cost by CPU seconds per kind of process, read from
    /proc: a grandchild's CPU is the command's (Ray's workers are the raylet's children), a process beside
    the command is not, and a process is sorted by its command line (`ray::ParameterServer` is a server)."""
    import sys

    from conftest import load_benchmark

    bench = load_benchmark("records_overhead")
    # 0.5 s of CPU, then alive a while so the sampler reads it whole however busy the machine
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\ntime.sleep(1)  # {}"
    server = [sys.executable, "-c", burn.format("ray::ParameterServer")]
    run_it = "import json, os, subprocess; subprocess.run(json.loads(os.environ['SERVER']))"
    command = subprocess.Popen([sys.executable, "-c", run_it], env={**os.environ, "SERVER": json.dumps(server)})
    beside = subprocess.Popen([sys.executable, "-c", burn.format("beside")])
    with bench.ProcessCPU(command.pid) as cpu:
        command.wait()
    beside.wait()
    kinds = cpu.by_kind()
    assert 0.45 <= kinds.get("servers", 0) < 0.9, kinds
    assert kinds.get("other", 0) < 0.3, kinds  # the command's own start, not the 0.5 s burnt beside it


def test_a_line_cut_short_by_a_crash_is_skipped_and_counted(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / runlog.LOG_FILE).write_text('{"event": "start", "run": "a", "t": 1.0}\n{"event": "epo')
    lines, skipped = runlog.read(str(model))
    assert [line["event"] for line in lines] == ["start"] and skipped == 1


# -- the page -------------------------------------------------------------------------------------

class _Page(html.parser.HTMLParser):
    """The ids, tags and outside references of an HTML page."""

    def __init__(self):
        super().__init__()
        self.ids: dict[str, str] = {}
        self.outside: list[str] = []
        self.scripts = 0
        self.images: dict[str, int] = {}  # id of the enclosing figure → inline images in it
        self._figure: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids[attrs["id"]] = tag
        if tag == "figure":
            self._figure = attrs.get("id")
        if tag == "script" and attrs.get("type") != "application/json":  # a data island runs nothing
            self.scripts += 1
        for name in ("src", "href", "xlink:href", "data"):
            value = attrs.get(name) or ""
            if re.match(r"^\s*(https?:|//|ftp:)", value) or (tag == "link"):
                self.outside.append(f"<{tag} {name}={value}>")
        if self._figure and (tag == "svg" or (tag == "img" and (attrs.get("src") or "").startswith("data:image/png;base64,"))):
            self.images[self._figure] = self.images.get(self._figure, 0) + 1

    def handle_endtag(self, tag):
        if tag == "figure":
            self._figure = None


@pytest.fixture(scope="module")
def page(trained_model, sample_corpus, tmp_path_factory) -> str:
    """The sample model's page, with its held-out pairs."""
    out = str(tmp_path_factory.mktemp("report") / "report.html")
    assert main(["report", "--model", trained_model, "--heldout", sample_corpus[1], "--out", out]) == 0
    return out


def test_the_page_has_every_section_and_figure_and_loads_nothing_from_a_network(page, trained_model,
                                                                                   sample_corpus):
    with open(page, encoding="utf-8") as fh:
        text = fh.read()
    found = _Page()
    found.feed(text)
    for section in SECTIONS:
        assert found.ids.get(section) == "section", section
    assert "refresh" not in found.ids  # not a refresh: no drift section
    for figure in FIGURES:
        assert found.ids.get(figure) == "figure" and found.images.get(figure, 0) == 1, figure
    assert found.outside == [] and found.scripts == 0
    assert "@import" not in text and "url(http" not in text
    # the figures come from evaluate's own machinery: its recall@10 and MRR, as `evaluate` gives them
    expected = heldout_metrics(trained_model, sample_corpus[1])
    quality = json.loads(re.search(r'<script type="application/json" id="figures">(.*?)</script>', text,
                                   re.DOTALL).group(1))["quality"]
    assert quality["model"]["recall"][9] == pytest.approx(expected["model_recall@10"])
    assert quality["popularity"]["recall"][9] == pytest.approx(expected["popularity_recall@10"])
    assert quality["model"]["mrr"] == pytest.approx(expected["model_mrr"])
    assert len(quality["model"]["recall"]) == 100 and len(quality["by_activity"]["model"]) == 10
    assert "PCA" in text and "umap-learn" in text  # which map it is, and how to get the other
    assert text.count('class="neighbors"') >= 2  # users' and URLs' nearest neighbours beside the map
    for word in ("servers", "workers", "model_id", "tokens", "checkpoint v10"):
        assert word in text, word


def test_the_page_renders_in_headless_chromium_without_console_errors(page, tmp_path):
    """A real browser: the DOM it built holds every section and figure, its console says nothing (the
    same check catches a page that throws: a control), and the screenshot is a picture, not a blank."""
    browser = chromium()
    dom, console = render(browser, page, tmp_path / "a")
    found = _Page()
    found.feed(dom)
    assert all(found.ids.get(s) == "section" for s in SECTIONS) and all(found.ids.get(f) == "figure" for f in FIGURES)
    assert console == [], console
    from PIL import Image

    pixels = np.asarray(Image.open(tmp_path / "a" / "shot.png").convert("L"), dtype=np.float64)
    assert pixels.shape == (1600, 1200) and pixels.std() > 20, pixels.std()
    control = tmp_path / "bad.html"
    control.write_text("<!doctype html><html><body><script>throw new Error('the control throws')</script></body></html>")
    assert any("the control throws" in line for line in render(browser, str(control), tmp_path / "b")[1])


def chromium() -> str:
    """Debian's chromium; .ci/run installs it where it is missing."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("no chromium on PATH: .ci/run installs Debian's `chromium`")
    pytest.skip("no chromium on PATH (apt-get install chromium; .ci/run installs it)")


BROWSER_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--enable-logging=stderr", "--v=0", "--hide-scrollbars")


def render(browser: str, path: str, work) -> tuple[str, list[str]]:
    """The DOM Chromium built from the page, and its console's messages; its screenshot in WORK/shot.png."""
    os.makedirs(work, exist_ok=True)
    url = "file://" + os.path.abspath(path)
    console = []
    dom = ""
    for what in ("--dump-dom", f"--screenshot={work}/shot.png"):
        profile = tempfile.mkdtemp(dir=work)
        done = subprocess.run([browser, *BROWSER_FLAGS, f"--user-data-dir={profile}", "--window-size=1200,1600",
                               what, url], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        console += [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
        if what == "--dump-dom":
            dom = done.stdout
    return dom, console


# -- the corpus the page reads: the model's, or left out ----------------------------------------------

@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict:
    """Small generated corpora: the model's (with its held-out pairs), another of the same sizes (other users and
    URLs, in as many rows), a larger one."""
    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.prepare import prepare
    from doc2vec_dist.synthetic import generate

    root = tmp_path_factory.mktemp("corpora")
    found = {"heldout": str(root / "heldout.parquet")}
    for name, users, seed, extra in (("ours", 300, 3, {"holdout": 0.2, "holdout_out": found["heldout"]}),
                                     ("same", 300, 4, {}), ("larger", 450, 5, {})):
        generate(str(root / f"events_{name}"), users, 200, seed=seed, progress=False)
        found[name] = prepare([str(root / f"events_{name}")], str(root / name), PrepareConfig(time_col="ts", **extra),
                              progress=False).path
    ours, same = Corpus(found["ours"]), Corpus(found["same"])
    assert (ours.num_docs, ours.vocab_size) == (same.num_docs, same.vocab_size) and ours.num_tokens != same.num_tokens
    assert ours.docs().column("key") != same.docs().column("key")
    return found


def _model_on(corpora: dict, tmp_path) -> tuple[str, str]:
    """A gensim model (one in a second) trained on a copy of the model's corpus: (model, the corpus's path)."""
    from doc2vec_dist.baseline import train_gensim

    corpus = str(tmp_path / "corpus")
    shutil.copytree(corpora["ours"], corpus)
    model = str(tmp_path / "model")
    train_gensim(corpus, model, TrainConfig(dim=16, epochs=3, sample=0, progress=False), workers=1)
    return model, corpus


def _user_headings(text: str) -> list[tuple[str, int]]:
    return [(k, int(n.replace(",", ""))) for k, n in re.findall(r"<h4>user <code>([^<]*)</code> \(([\d,]+) events\)", text)]


@pytest.mark.parametrize("replacement", ["same", "larger"])
def test_another_corpus_where_the_models_was_is_left_out_of_the_page_with_a_warning(corpora, tmp_path, capsys,
                                                                                  replacement):
    """The page read whatever corpus was at the path the model's config.json names: another of the same sizes gave
    it that corpus's tokens, each sample user another user's events and visited URLs (exit 0), a larger one an
    ArrowIndexError. The corpus is checked first, as neighbors checks it (its sizes) and train --resume does (its
    users and URLs, row for row): another one is left out of the page, with one warning line naming it and what
    differs; --heldout, whose ranking leaves out the URLs each user visited, is refused in one line."""
    model, corpus = _model_on(corpora, tmp_path)
    page = str(tmp_path / "page.html")
    assert main(["report", "--model", model, "--out", page]) == 0  # its own corpus: read
    text = pathlib.Path(page).read_text(encoding="utf-8")
    assert f"<td>tokens</td><td>{Corpus(corpus).num_tokens:,}</td>" in text and "less those visited" in text
    # a gensim model's settings, less the engine's options its config.json holds at their defaults (num_ps 2, …)
    assert "<td>dim</td><td>16</td>" in text and "<td>num_ps</td>" not in text and "<td>macro_batch</td>" not in text
    assert capsys.readouterr().err == ""
    lengths = dict(zip(modeldir.ModelDir(model).keys("docs").to_pylist(),
                       Corpus(corpus).docs().column("length").to_pylist()))
    assert all(lengths[key] == events for key, events in _user_headings(text))

    shutil.rmtree(corpus)
    shutil.copytree(corpora[replacement], corpus)
    other = Corpus(corpus)
    assert main(["report", "--model", model, "--out", page]) == 0
    warned = capsys.readouterr().err.strip().splitlines()
    assert len(warned) == 1 and warned[0].startswith("warning: report: ") and other.path in warned[0], warned
    differs = (f"({other.num_tokens:,} tokens, the model's " if replacement == "same" else
               f"({other.num_docs:,} users and {other.vocab_size:,} URLs, the model {len(lengths):,} and")
    assert differs in warned[0], warned
    text = pathlib.Path(page).read_text(encoding="utf-8")
    assert f"<td>tokens</td><td>{other.num_tokens:,}</td>" not in text and "less those visited" not in text
    users = _user_headings(text)
    assert users and all(lengths[key] == events for key, events in users)  # each user's own events, the model's

    assert main(["report", "--model", model, "--out", page, "--heldout", corpora["heldout"]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: report --heldout: ") and other.path in err[0], err


def test_evaluate_and_neighbors_check_the_corpus_as_the_page_does(corpora, tmp_path, capsys):
    """evaluate --heldout of an unchanged model gave other figures (recall 0.27 → 0.20, exit 0, a warning blaming the
    held-out file) once another corpus was prepared at its corpus path; neighbors left out another user's visited
    URLs where that corpus had the same sizes. Both check it as report does (model.model_corpus)."""
    import pyarrow.parquet as pq

    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.prepare import prepare

    model, corpus = _model_on(corpora, tmp_path)
    user = modeldir.ModelDir(model).keys("docs")[0].as_py()
    assert main(["evaluate", "--model", model, "--heldout", corpora["heldout"]]) == 0
    assert main(["neighbors", "--model", model, "--key", user, "--against", "words_out"]) == 0
    capsys.readouterr()
    from doc2vec_dist.model import Model

    served = Model.load(model)  # a serving process, loaded before the corpus is replaced
    served.neighbors([user], against="words_out", exclude_seen=True)
    # the same events in another order: the same sizes and tokens, other users on each row
    events = pq.read_table(os.path.join(os.path.dirname(corpora["ours"]), "events_ours", "events"))
    pq.write_table(events.take(np.random.default_rng(7).permutation(len(events))), tmp_path / "shuffled.parquet")
    shuffled = prepare([str(tmp_path / "shuffled.parquet")], corpus, PrepareConfig(
        time_col="ts", holdout=0.2, holdout_out=str(tmp_path / "h.parquet")), progress=False, overwrite=True)
    assert shuffled.num_tokens == Corpus(corpora["ours"]).num_tokens
    assert main(["evaluate", "--model", model, "--heldout", corpora["heldout"]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: the model's corpus {corpus} is not the one it was trained on: "
                                               f"{model} was trained on other users (row "), err
    assert main(["neighbors", "--model", model, "--key", user, "--against", "words_out"]) == 0  # by default: said
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not the one it was trained on" in err[0] and err[0].endswith(
        "the URLs each user visited are not left out of the answer"), err
    assert main(["neighbors", "--model", model, "--key", user, "--against", "words_out", "--exclude-seen"]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # asked for: refused
    assert len(err) == 1 and "is not the one it was trained on" in err[0] and "--no-exclude-seen" in err[0], err
    with pytest.raises(UserError, match="is not the one it was trained on"):  # checked again: corpus.json changed
        served.neighbors([user], against="words_out", exclude_seen=True)


def test_a_gensim_models_corpus_of_the_same_keys_but_other_events_is_found_out(corpora, tmp_path):
    """A baseline model's manifest held no corpus_stats, so a corpus prepared again at its path from the same events
    with --max-tokens-per-doc (the same users and URLs, row for row; other events) passed model_corpus."""
    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.model import model_corpus
    from doc2vec_dist.prepare import prepare

    model, corpus = _model_on(corpora, tmp_path)
    found = modeldir.ModelDir(model)
    assert model_corpus(found)[1] is None
    events = os.path.join(os.path.dirname(corpora["ours"]), "events_ours")
    capped = prepare([events], corpus, PrepareConfig(time_col="ts", holdout=0.2, max_tokens_per_doc=5,
                                                     holdout_out=str(tmp_path / "h.parquet")),
                     progress=False, overwrite=True)
    assert capped.docs().column("key").equals(Corpus(corpora["ours"]).docs().column("key"))
    assert model_corpus(found) == (None, (f"the model's corpus {corpus} is not the one it was trained on "
                                         f"({capped.num_tokens:,} tokens, the model's "
                                         f"{Corpus(corpora['ours']).num_tokens:,})"))


def test_the_tokens_per_second_of_runs_resumed_mid_epoch_count_what_each_run_trained(corpora, tmp_path):
    """An epoch line's tokens are its whole epoch's; the first epoch of a run resumed from a mid-epoch checkpoint
    trained only its rest, in its wall_seconds (its tokens_per_second counts that: run.epoch_line). The page
    summed the whole epochs over the runs' seconds: 2,000 tokens and 1,333 tokens/s for 1,200 trained in 1.5 s."""
    from doc2vec_dist.report import report

    model, _ = _model_on(corpora, tmp_path)

    def page_of(resumed_from: int, second: dict) -> str:
        lines = [{"event": "start", "run": "a", "t": 1000.0, "resumed_from": None, "epoch": 0},
                 {"event": "epoch", "run": "a", "t": 1001.0, "epoch": 1, "tokens": 1000, "pairs": 5000, "loss": 0.5,
                  "wall_seconds": 1.0, "tokens_per_second": 1000.0},
                 {"event": "checkpoint", "run": "a", "t": 1001.1, "version": 1, "epoch": 1, "mid_epoch": False},
                 {"event": "checkpoint", "run": "a", "t": 1001.6, "version": 2, "epoch": 1, "mid_epoch": True},
                 {"event": "stop", "run": "a", "t": 1001.7, "reason": "interrupted"},
                 {"event": "start", "run": "b", "t": 1100.0, "resumed_from": resumed_from, "epoch": 1},
                 {"event": "epoch", "run": "b", "t": 1100.6, "epoch": 2, "tokens": 1000, "pairs": 5000, "loss": 0.4,
                  **second},
                 {"event": "checkpoint", "run": "b", "t": 1100.7, "version": 3, "epoch": 2, "mid_epoch": False},
                 {"event": "end", "run": "b", "t": 1100.8}]
        with open(os.path.join(model, runlog.LOG_FILE), "w") as fh:
            fh.writelines(json.dumps(line) + "\n" for line in lines)
        out = str(tmp_path / f"page{resumed_from}.html")
        report(model, out, sample=50)
        text = pathlib.Path(out).read_text(encoding="utf-8")
        return text[text.find("<h3>Duration"):]

    # resumed from v2, mid-epoch: the run trained 400 tokens/s × 0.5 s of epoch 2
    duration = page_of(2, {"wall_seconds": 0.5, "tokens_per_second": 400.0})
    assert "<td>tokens</td><td>1,200</td>" in duration and "<td>tokens/s</td><td>800</td>" in duration, duration
    # resumed from v1, at the epoch's end: epoch 2 trained whole
    duration = page_of(1, {"wall_seconds": 0.5, "tokens_per_second": 2000.0})
    assert "<td>tokens</td><td>2,000</td>" in duration and "<td>tokens/s</td><td>1,333</td>" in duration, duration
