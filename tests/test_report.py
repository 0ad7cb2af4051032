"""What a person looks at (issue 52): the training log a run writes as it goes (MODEL/training.jsonl), the run's
figures in Ray's metrics, and the report page (`doc2vec-dist report`), rendered in a real headless Chromium."""

from __future__ import annotations

import html.parser
import json
import os
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
