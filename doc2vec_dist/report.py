"""The report page of a model: one self-contained HTML file that says how a run went and what it made.

Changes when what the page shows, or how it is drawn, changes.

    doc2vec-dist report --model MODEL [--heldout HELDOUT] --out PAGE.html

Sections (each a <section> with its id; each figure a <figure> with its id):

    run       the settings as resolved, the corpus (size, dates), the cluster (servers, workers, devices, the
              nodes each run placed its actors on), provenance (model id, lineage, version) and the duration
    training  fig-loss (loss by epoch), fig-throughput (tokens/s by epoch, the run's and each worker's),
              fig-time-split (each worker's time by stage, stacked), fig-timeline (epochs, checkpoints,
              restarts and runs over the wall clock): from MODEL/training.jsonl (runlog)
    quality   with --heldout: fig-recall (recall@k, k = 1..100, against the most-popular ranking),
              fig-recall-by-activity (recall@10 by decile of the users' events), MRR; evaluate's own
              ranking (evaluate.rank_heldout), on its sample of users
    space     fig-map: a sample of users and the most visited URLs in 2-D (UMAP where umap-learn is
              installed, else PCA; the page says which), URLs coloured by host, users by their most visited
              host; beside it the nearest neighbours of a few of them
    refresh   a model trained --init-from another: fig-drift (cosine of the known keys' old and new vectors)
              and the counts of new and grown users and URLs (corpus.json's `refresh`)

Nothing is loaded from a network: the figures are inline SVG (lines and bars) or PNG (the map), drawn
with matplotlib; the style is inline; the page runs no script. Its figures' numbers are in a JSON data
island (`<script type="application/json" id="figures">`) for other tools.

The corpus is the one config.json names, checked first (model.model_corpus: as neighbors, evaluate and train
--resume check it); where it is gone or another, what would be read from it is left out, with one warning line, and
--heldout is refused.

The page reads samples, never a whole table of users: a 20M-user docs table is 8 GB. Users come from a
few record batches of the corpus (corpus.sample_documents), their rows kept as the parts stream by
(_streamed_rows: a row read through the memory map maps a whole large folio, so 2,000 random users of 8 GB
made 2 GiB resident); the URL table is streamed a record batch at a time for the neighbours. The quality
section costs what `evaluate --heldout` costs (it reads the corpus's shards for the URLs each user saw).
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import time
from datetime import datetime

import numpy as np
import pyarrow as pa

from . import outputs, runlog
from .config import engine_only
from .corpus import sample_documents
from .errors import UserError
from .export import most_visited_hosts
from .memwatch import peak_rss_bytes
from .model import model_corpus
from .modeldir import ModelDir
from .scoring import unit_rows, url_log_prior
from .urls import hosts

log = logging.getLogger(__name__)

SAMPLE = 2000          # users, and URLs, on the map
NEIGHBOURS = 5         # shown for each of the sample queries
QUERIES = 3            # users, and URLs, whose neighbours are shown
TOP_K = 100            # recall@k is drawn for k = 1..TOP_K
MAX_USERS = 5000       # users whose held-out URLs are ranked (a random sample, as evaluate takes): recall@10 to ~0.005
QUALITY_BATCH = 32     # users scored at a time: a [32, URLs] score matrix per ranking
COLOURED_HOSTS = 9     # hosts with a colour of their own on the map; the others are grey
STAGE_ORDER = ("read", "sample", "pull", "wait", "compute", "push", "barrier")
# what the run section shows first (the rest: a table under it)
KEY_SETTINGS = ("mode", "dim", "epochs", "window", "negative", "sample", "alpha", "min_alpha", "optimizer", "dtype",
                "num_ps", "num_workers", "cpus_per_worker", "gpus_per_worker", "schedule", "segments", "macro_batch",
                "seed", "init_from", "first_epoch")
UMAP_EXTRA = "pip install 'doc2vec-dist[umap]'"


def report(model: str, out: str, heldout: str | None = None, sample: int = SAMPLE, seed: int = 0,
           max_users: int | None = MAX_USERS) -> dict:
    """Write the page of `model` to `out` (an earlier page is replaced, anything else refused); returns where,
    how long it took, the map's method and the peak memory."""
    from .runners import calm_openmp

    calm_openmp()  # before faiss or torch
    t0 = time.perf_counter()
    if sample < 1:
        raise UserError(f"--sample {sample}: give at least 1 point of each kind for the map")
    outputs.check_file(out, "report")  # before the work: nothing there, or an earlier page
    outputs.check_writable(out)
    found = ModelDir.served(model)
    page = _Page(found, model)
    if page.corpus_problem is not None:
        if heldout:  # as neighbors refuses to leave out the URLs each user visited when asked to, without them
            raise UserError(f"report --heldout: {page.corpus_problem}: the held-out ranking leaves out the URLs each "
                            "user visited, read from it; put the corpus the model was trained on back at that path, "
                            "or leave out --heldout")
        log.warning(f"warning: report: {page.corpus_problem}: the page leaves out what it reads from the corpus (its "
                    "size and dates, the users' URLs and the refresh's counts)")
    page.run_section()
    page.training_section()
    if heldout:
        page.quality_section(heldout, max_users, seed)
    else:
        page.note("quality", "Quality", "Give <code>--heldout FILE</code> (the pairs <code>prepare --holdout</code> set "
                  "aside) for recall@k against the most-popular ranking, by user activity, and MRR.")
    page.space_section(sample, seed)
    page.refresh_section()
    with outputs.replacing(out, "report") as staged, open(staged.path, "w", encoding="utf-8") as fh:
        fh.write(page.html())
    return {"path": out, "seconds": round(time.perf_counter() - t0, 2), "map": page.figures.get("map", {}).get("method"),
            "sections": [s for s, _ in page.sections], "peak_rss_bytes": peak_rss_bytes()}


# ---------------------------------------------------------------------------------------------------
# drawing
# ---------------------------------------------------------------------------------------------------

def _figure(width: float = 7.0, height: float = 3.2):
    """A matplotlib Figure with no pyplot state (and so no display)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig


def _svg(fig) -> str:
    """The figure as inline SVG: text drawn as paths (no font to load), no XML header or metadata."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "doc2vec-dist"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buffer.getvalue()
    start = text.index("<svg")
    metadata = text.find("<metadata>")
    if metadata != -1:
        text = text[:metadata] + text[text.index("</metadata>") + len("</metadata>"):]
        start = text.index("<svg")
    return text[start:]


def _png(fig, dpi: int = 110) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return f'<img alt="" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def _table(rows: list[tuple], header: tuple | None = None, cls: str = "") -> str:
    head = "" if header is None else "<tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in header) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td>{c if isinstance(c, _Html) else html.escape(_shown(c))}</td>" for c in row)
                   + "</tr>" for row in rows)
    return f'<table{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}>{head}{body}</table>'


class _Html(str):
    """Text already HTML (not escaped again in a table)."""


def _shown(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "—"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_shown(v) for v in value) or "—"
    return str(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


# ---------------------------------------------------------------------------------------------------
# the page
# ---------------------------------------------------------------------------------------------------

class _Page:
    def __init__(self, found: ModelDir, shown: str):
        self.found, self.shown = found, shown
        self.settings = found.settings()
        self.summary = self.settings.get("summary") or {}
        self.lines, self.skipped = runlog.read(found.path)
        self.sections: list[tuple[str, str]] = []
        self.figures: dict = {}
        self.corpus, self.corpus_problem = model_corpus(found, self.settings.get("corpus"))  # as neighbors checks it

    def add(self, key: str, title: str, body: str) -> None:
        self.sections.append((key, f'<section id="{key}"><h2>{html.escape(title)}</h2>{body}</section>'))

    def note(self, key: str, title: str, text: str) -> None:
        self.add(key, title, f'<p class="note">{text}</p>')

    # -- the run ---------------------------------------------------------------------------------
    def run_section(self) -> None:
        s, m, summary = self.settings, self.found.manifest, self.summary
        gensim = s.get("trainer") == "gensim" or summary.get("trainer") == "gensim"
        # a gensim baseline's config.json holds the engine's options at their defaults, which it never used
        unused = engine_only() if gensim else set()
        settings = [(k, s.get(k)) for k in KEY_SETTINGS if k in s and k not in unused]
        rest = sorted((k, v) for k, v in s.items()
                      if k not in KEY_SETTINGS and k not in ("summary", "corpus") and k not in unused)
        body = ['<div class="cols"><div>', "<h3>Settings, as resolved</h3>", _table(settings),
                f"<details><summary>all {len(settings) + len(rest)} settings</summary>{_table(rest)}</details></div>"]
        corpus = [("path", s.get("corpus"))]
        if self.corpus is not None:
            meta = self.corpus.meta
            corpus += [("users", self.corpus.num_docs), ("tokens", self.corpus.num_tokens),
                       ("URLs", self.corpus.vocab_size), ("shards", self.corpus.num_shards)]
            dates = meta.get("time_range")
            if isinstance(dates, (list, tuple)) and len(dates) == 2:
                corpus.append(("dates", " to ".join(_date(d) for d in dates)))
            elif isinstance(dates, dict):
                corpus.append(("dates", " to ".join(_date(dates.get(k)) for k in ("min", "max"))))
            corpus.append(("prepared", meta.get("created")))
        else:
            corpus.append(("note", self.corpus_problem))
        body += ["<div><h3>Corpus</h3>", _table(corpus)]
        gpus = s.get("gpus_per_worker") or 0
        cluster = [("servers", f"{s.get('num_ps')} parameter server(s)"),
                   ("workers", f"{s.get('num_workers')} x {s.get('cpus_per_worker')} CPU"
                               + (f" + {gpus:g} GPU" if gpus else "")),
                   ("devices", "GPU (CUDA)" if gpus else "CPU")]
        starts = [line for line in self.lines if line["event"] == "start"]
        for i, start in enumerate(starts):
            for where in start.get("where") or []:
                cluster.append((f"run {i + 1}" if len(starts) > 1 else "placed", where))
        if gensim:
            cluster = [("trainer", (f"gensim ({summary.get('gensim_mode', '?')} mode), "
                                   f"{summary.get('workers', '?')} threads"))]
        body += ["<h3>Cluster</h3>", _table(cluster)]
        provenance = [("model", self.shown), ("model_id", m.get("model_id")),
                      ("derived_from", m.get("derived_from") or "—"),
                      ("checkpoint", f"checkpoint v{self.found.version}, {m.get('created')}"),
                      ("epochs done", m.get("epoch")), ("trainer", s.get("trainer") or "doc2vec-dist")]
        body += ["<h3>Provenance</h3>", _table(provenance)]
        ends = [line for line in self.lines if line["event"] in ("end", "stop")]
        wall = ends[-1]["t"] - self.lines[0]["t"] if ends and self.lines else None
        trained, tokens, rate, last = summary.get("train_seconds"), summary.get("tokens"), \
            summary.get("tokens_per_second"), ""
        epochs = [line for line in self.lines if line["event"] == "epoch"]
        if len(starts) > 1 and epochs:  # the summary is the last run's: every run's epochs are in the log
            trained = sum(e.get("wall_seconds", 0.0) for e in epochs)
            tokens = _tokens_trained(self.lines)
            rate = round(tokens / trained) if trained else None
            last = ", the last run's"
        duration = [("training" + (", every run's epochs" if last else ""), _duration(trained)),
                    ("start-up" + last, _duration(summary.get("startup_seconds"))),
                    ("checkpoints" + last, _duration(summary.get("checkpoint_seconds"))),
                    ("tokens", tokens),
                    ("tokens/s", rate),
                    ("runs", f"{len(starts)} ({len(starts) - 1} resumed)" if starts else "—"),
                    ("wall clock, first start to last end", _duration(wall))]
        body += ["<h3>Duration</h3>", _table(duration), "</div></div>"]
        self.add("run", "The run", "".join(body))

    # -- training --------------------------------------------------------------------------------
    def training_section(self) -> None:
        epochs = [line for line in self.lines if line["event"] == "epoch"]
        body = []
        if self.skipped:
            body.append(f'<p class="note">{self.skipped} line(s) of {runlog.LOG_FILE} could not be read (cut short by a '
                        "crash) and are left out.</p>")
        if not epochs:
            losses = self.summary.get("loss_per_epoch") or []
            body.append(f'<p class="note">{runlog.LOG_FILE} holds no finished epoch: its run stopped in its first one'
                        if self.lines else f'<p class="note">No training log ({runlog.LOG_FILE}): this model was '
                        "trained by gensim or by a version of doc2vec-dist before the log")
            body.append("; the figures below are its summary's.</p>" if losses else ".</p>")
            if losses:
                body.append(self._loss_figure(list(range(1, len(losses) + 1)), losses))
            self.add("training", "Training", "".join(body))
            return
        # a resumed run trains its epochs again from a checkpoint: the last line of each epoch counts
        by_epoch = {e["epoch"]: e for e in epochs}
        shown = [by_epoch[k] for k in sorted(by_epoch)]
        x = [e["epoch"] for e in shown]
        body.append(self._loss_figure(x, [e["loss"] for e in shown]))
        body.append(self._throughput_figure(x, shown))
        body.append(self._split_figure(shown))
        body.append(self._timeline_figure())
        self.add("training", "Training", "".join(body))

    def _loss_figure(self, x: list[int], losses: list[float]) -> str:
        self.figures["loss"] = {"epoch": x, "loss": losses}
        fig = _figure(7, 2.6)
        ax = fig.add_subplot()
        ax.plot(x, losses, marker="o", color="#1f77b4")
        ax.set(xlabel="epoch", ylabel="loss per pair", title="Loss by epoch")
        ax.grid(alpha=0.3)
        return _fig("fig-loss", _svg(fig), "The mean negative-sampling loss per (user, URL) pair of each epoch.")

    def _throughput_figure(self, x: list[int], epochs: list[dict]) -> str:
        whole = [e["tokens_per_second"] for e in epochs]
        workers = sorted({w["worker"] for e in epochs for w in e.get("workers", [])})
        per = {i: [next((w["tokens_per_second"] for w in e.get("workers", []) if w["worker"] == i), np.nan)
                   for e in epochs] for i in workers}
        self.figures["throughput"] = {"epoch": x, "tokens_per_second": whole,
                                      "workers": {str(i): v for i, v in per.items()}}
        fig = _figure(7, 2.8)
        ax = fig.add_subplot()
        ax.plot(x, np.array(whole) / 1e6, marker="o", linewidth=2.5, color="black", label="the run")
        for i in workers:  # dashed, so that workers of equal speed all show
            ax.plot(x, np.array(per[i]) / 1e6, marker=".", linewidth=1.2, linestyle=(i % 4, (4, 3)),
                    label=f"worker {i}")
        ax.set(xlabel="epoch", ylabel="M tokens/s", title="Tokens per second by epoch")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncols=min(4, len(workers) + 1))
        return _fig("fig-throughput", _svg(fig), "Tokens trained per second of wall clock (checkpoints not counted), "
                    "the whole run's and each worker's.")

    def _split_figure(self, epochs: list[dict]) -> str:
        totals: dict[int, dict[str, float]] = {}
        for e in epochs:
            for w in e.get("workers", []):
                mine = totals.setdefault(w["worker"], {})
                for k, v in w["seconds"].items():
                    mine[k] = mine.get(k, 0.0) + v
        stages = [k for k in STAGE_ORDER if any(k in t for t in totals.values())]
        stages += sorted({k for t in totals.values() for k in t} - set(stages))
        self.figures["time_split"] = {str(i): t for i, t in totals.items()}
        fig = _figure(7, 1.3 + 0.45 * max(1, len(totals)))
        ax = fig.add_subplot()
        left = np.zeros(len(totals))
        names = [f"worker {i}" for i in totals]
        colours = dict(zip(STAGE_ORDER, ("#8c564b", "#e377c2", "#1f77b4", "#bcbd22", "#2ca02c", "#ff7f0e", "#7f7f7f")))
        for stage in stages:
            values = np.array([t.get(stage, 0.0) for t in totals.values()])
            ax.barh(names, values, left=left, label=stage, color=colours.get(stage))
            left += values
        ax.invert_yaxis()
        ax.set(xlabel="seconds, all epochs", title="Where each worker's time went")
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", fontsize=8, ncols=len(stages),
                   frameon=False)
        return _fig("fig-time-split", _svg(fig), "Each worker's seconds by stage: read (the shards), sample (examples), "
                    "pull (rows from the servers), wait (for a pull in flight), compute (the kernel), push (updates "
                    "back), barrier (waiting for the worker that held its next block, and at the epoch's end for the last worker).")

    def _timeline_figure(self) -> str:
        t0 = self.lines[0]["t"]
        hours = max(line["t"] for line in self.lines) - t0 >= 3 * 3600
        unit, scale = ("hours", 3600.0) if hours else ("minutes", 60.0)

        def at(t: float) -> float:
            return (t - t0) / scale

        fig = _figure(7, 2.4)
        ax = fig.add_subplot()
        rows = {"epochs": 2, "checkpoints": 1, "restarts": 0}
        marks = {"checkpoint": [], "restart": [], "start": [], "stop": []}
        for line in self.lines:
            if line["event"] == "epoch":
                start = at(line["t"] - line.get("wall_seconds", 0))
                ax.barh(rows["epochs"], max(at(line["t"]) - start, 1e-9), left=start, height=0.6,
                        color="#1f77b4" if line["epoch"] % 2 else "#6baed6")
            elif line["event"] in marks:
                marks[line["event"]].append(line)
        ax.plot([at(c["t"]) for c in marks["checkpoint"]], [rows["checkpoints"]] * len(marks["checkpoint"]), "|",
                markersize=14, color="#2ca02c", label="checkpoint")
        ax.plot([at(r["t"]) for r in marks["restart"]], [rows["restarts"]] * len(marks["restart"]), "x", markersize=9,
                color="#d62728", label="worker restart")
        for start in marks["start"]:
            ax.axvline(at(start["t"]), color="black", linestyle="--", linewidth=1)
            ax.annotate("resumed" if start.get("resumed_from") else "start", (at(start["t"]), 2.45), fontsize=8,
                        xytext=(3, 0), textcoords="offset points")
        for stop in marks["stop"]:
            ax.axvline(at(stop["t"]), color="#d62728", linestyle=":", linewidth=1.5)
        ax.set_yticks(list(rows.values()), list(rows))
        ax.set_ylim(-0.6, 2.8)
        ax.set(xlabel=f"{unit} since the first run started", title="Time line")
        ax.grid(alpha=0.3, axis="x")
        self.figures["timeline"] = {"checkpoints": [c["version"] for c in marks["checkpoint"]],
                                    "restarts": len(marks["restart"]), "runs": len(marks["start"])}
        return _fig("fig-timeline", _svg(fig), "Each epoch (alternating blues), each checkpoint committed, each worker "
                    "restart; a dashed line where a run started or resumed, a dotted red one where a run stopped.")

    # -- quality ---------------------------------------------------------------------------------
    def quality_section(self, heldout: str, max_users: int | None, seed: int) -> None:
        from .evaluate import rank_heldout

        # scored QUALITY_BATCH users at a time (evaluate's 512 hold 4 GB of scores at 1M URLs), their rows streamed
        found = rank_heldout(self.found.path, heldout, TOP_K, max_users=max_users, seed=seed,
                             corpus_path=self.corpus.path, batch=QUALITY_BATCH, gather=_streamed_rows)
        ks = np.arange(1, TOP_K + 1)
        quality = {name: {"recall": [float(found.recall(name, k).mean()) for k in ks],
                          "mrr": float(found.reciprocal[name].mean())} for name in found.ranks}
        lengths = self._lengths(found.users)
        groups = np.array_split(np.argsort(lengths, kind="stable"), min(10, len(found.users)))
        at10 = {name: found.recall(name, 10) for name in found.ranks}
        by_activity = {name: [float(at10[name][g].mean()) for g in groups] for name in found.ranks}
        spans = [f"{int(lengths[g].min())}–{int(lengths[g].max())}" for g in groups]
        quality["by_activity"] = {**by_activity, "events": spans}
        quality["users"], quality["users_with_pairs"] = len(found.users), found.users_with_pairs
        self.figures["quality"] = quality
        fig = _figure(7, 3)
        ax = fig.add_subplot()
        for name, colour in (("model", "#1f77b4"), ("popularity", "#7f7f7f")):
            ax.plot(ks, quality[name]["recall"], color=colour, label="the model" if name == "model" else "most popular")
        ax.set_xscale("log")
        ax.set(xlabel="k", ylabel="recall@k", title="Held-out URLs in the top k", ylim=(0, None))
        ax.grid(alpha=0.3, which="both")
        ax.legend()
        curve = _fig("fig-recall", _svg(fig), "The share of each user's held-out URLs ranked in its top k (URLs it "
                     "was trained on left out), averaged over users, for k = 1 to 100.")
        fig = _figure(7, 3)
        ax = fig.add_subplot()
        x = np.arange(len(groups))
        ax.bar(x - 0.2, by_activity["model"], 0.4, label="the model", color="#1f77b4")
        ax.bar(x + 0.2, by_activity["popularity"], 0.4, label="most popular", color="#7f7f7f")
        ax.set_xticks(x, spans, fontsize=7, rotation=30)
        ax.set(xlabel="the user's events in training (deciles of users)", ylabel="recall@10",
               title="Recall@10 by user activity")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
        deciles = _fig("fig-recall-by-activity", _svg(fig), "Users in ten groups of equal size by their number of "
                       "events: a model that serves only heavy users shows it here.")
        rows = [("the model", quality["model"]["recall"][9], quality["model"]["mrr"]),
                ("most popular", quality["popularity"]["recall"][9], quality["popularity"]["mrr"])]
        text = (f"<p>{len(found.users):,} users with held-out pairs"
                + (f" (a random {len(found.users):,} of {found.users_with_pairs:,}, seed {seed})"
                   if len(found.users) < found.users_with_pairs else "")
                + f", {len(found.user_of_pair):,} pairs, from <code>{html.escape(heldout)}</code>"
                + (f"; {found.skipped_pairs:,} pairs name a user or URL the model lacks and are left out" if
                   found.skipped_pairs else "") + ".</p>")
        self.add("quality", "Quality", text + _table(rows, ("ranking", "recall@10", "MRR")) + curve + deciles)

    def _lengths(self, users: np.ndarray) -> np.ndarray:
        """Each user's events in training: docs.arrow's length column (the corpus's copy in the model)."""
        with pa.memory_map(self.found.store.path("docs.arrow")) as source:
            table = pa.ipc.open_file(source).read_all()
        if "length" not in table.column_names:
            return np.zeros(len(users))
        return table.column("length").take(pa.array(users)).to_numpy().astype(np.int64)

    # -- the space -------------------------------------------------------------------------------
    def space_section(self, sample: int, seed: int) -> None:
        from .model import Model

        found, model = self.found, Model(self.found.path)
        vocab = found.vocab()
        counts = vocab.column("count").to_numpy()
        url_ids = np.sort(np.argsort(-counts, kind="stable")[:sample]).astype(np.int64)
        url_ids = url_ids[counts[url_ids] > 0]
        if self.corpus is not None:
            user_ids, user_tokens = sample_documents(self.corpus, sample, seed)
        else:  # no corpus: users at random, without their URLs
            rows = found.spec("docs")["rows"]
            user_ids = np.sort(np.random.default_rng(seed).choice(rows, min(sample, rows), replace=False))
            user_tokens = [np.zeros(0, np.int32)] * len(user_ids)
        tokens = vocab.column("token")
        url_hosts = hosts(tokens.take(pa.array(url_ids))).to_pylist()
        user_hosts = most_visited_hosts(user_tokens, tokens)
        users = unit_rows(_streamed_rows(found, "docs", user_ids))
        urls = unit_rows(model.gather("words_out", url_ids))
        (user_xy, url_xy), method = _project([users, urls], seed)
        palette = _palette([h for h in url_hosts + user_hosts if h])
        fig = _figure(10, 4.6)
        axes = fig.subplots(1, 2)
        for ax, xy, named, what in ((axes[0], user_xy, user_hosts, "users, by their most visited host"),
                                    (axes[1], url_xy, url_hosts, "URLs, by host")):
            colours = [palette.get(h, "#c7c7c7") for h in named]
            grey = np.array([c == "#c7c7c7" for c in colours])
            ax.scatter(xy[grey, 0], xy[grey, 1], s=5, c="#c7c7c7", linewidths=0)
            ax.scatter(xy[~grey, 0], xy[~grey, 1], s=7, c=[c for c, g in zip(colours, grey) if not g], linewidths=0)
            ax.set(title=f"{len(xy):,} {what}", xticks=[], yticks=[])
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], marker="o", linestyle="", color=c, label=h) for h, c in palette.items()]
        handles.append(Line2D([], [], marker="o", linestyle="", color="#c7c7c7", label="other hosts"))
        if any(url_hosts):
            fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
        how = ("UMAP (umap-learn, cosine)" if method == "UMAP" else
               f"PCA of the unit vectors (umap-learn is not installed: {UMAP_EXTRA} draws the map with UMAP)")
        self.figures["map"] = {"method": method, "users": len(user_ids), "urls": len(url_ids),
                               "hosts": list(palette)}
        text = (f"<p>The map: {how}, users and URLs each projected on their own. Users: a seeded sample of "
                f"{len(user_ids):,}" + (" read from a few record batches of the corpus" if self.corpus is not None else
                                        " (the model's corpus is not at hand: no hosts for them)")
                + f"; URLs: the {len(url_ids):,} most visited.</p>")
        if not any(url_hosts):
            text += '<p class="note">The tokens are not URLs: nothing to colour by host.</p>'
        body = [text, _fig("fig-map", _png(fig), "Each point a user (left) or a URL (right); the nine hosts most "
                           "frequent on the map have colours of their own.")]
        body.append(self._neighbours(model, user_ids, user_tokens, users, url_ids, seed))
        self.add("space", "The space", "".join(body))

    def _neighbours(self, model, user_ids: np.ndarray, user_tokens: list[np.ndarray], users: np.ndarray,
                    url_ids: np.ndarray, seed: int) -> str:
        """Tables of the nearest neighbours of a few sample users (similar users among the map's, likeliest URLs
        among all, less those they visited) and URLs (similar URLs among all): one pass over the URL table."""
        found = self.found
        rng = np.random.default_rng(seed)
        active = np.flatnonzero([len(t) >= 3 for t in user_tokens]) if any(len(t) for t in user_tokens) else \
            np.arange(len(user_ids))
        picked = np.sort(rng.choice(active, min(QUERIES, len(active)), replace=False)) if len(active) else []
        url_picks = [int(url_ids[r]) for r in (0, 9, 99) if r < len(url_ids)][:QUERIES]
        token = found.vocab().column("token")
        user_key = _keys_of(found, "docs", user_ids[picked] if len(picked) else np.zeros(0, np.int64))
        # similar users among the map's users (cosine)
        similar = users[picked] @ users.T if len(picked) else np.zeros((0, 0))
        prior = url_log_prior(found)
        user_rows = _streamed_rows(found, "docs", user_ids[picked]) if len(picked) else \
            np.zeros((0, users.shape[1]), np.float32)
        url_rows = unit_rows(model.gather("words_out", np.array(url_picks, np.int64)))
        likely, near = _scan_words_out(found, user_rows, [user_tokens[i] for i in picked], prior, url_rows,
                                       np.array(url_picks, np.int64), NEIGHBOURS)
        # each user's events: its URLs in the corpus, else the model's copy of the corpus's lengths
        events = [len(user_tokens[i]) for i in picked] if self.corpus is not None or not len(picked) else \
            self._lengths(user_ids[picked])
        unseen = "likeliest URLs, less those visited" if self.corpus is not None else \
            "likeliest URLs (those visited left in: the corpus is not at hand)"
        blocks = []
        for n, i in enumerate(picked):
            order = [j for j in np.argsort(-similar[n]) if j != i][:NEIGHBOURS]
            rows = [(_Html(f"<code>{html.escape(str(k))}</code>"), f"{s:.3f}") for k, s in
                    zip(_keys_of(found, "docs", user_ids[order]), similar[n][order])]
            urls = [(_Html(f"<code>{html.escape(token[int(w)].as_py())}</code>"), f"{s:.2f}") for w, s in likely[n]]
            blocks.append(f"<div><h4>user <code>{html.escape(str(user_key[n]))}</code> ({int(events[n]):,} "
                          f"events)</h4>{_table(rows, ('similar users (of the map)', 'cosine'), 'neighbors')}"
                          f"{_table(urls, (unseen, 'log score'), 'neighbors')}</div>")
        for n, w in enumerate(url_picks):
            rows = [(_Html(f"<code>{html.escape(token[int(j)].as_py())}</code>"), f"{s:.3f}") for j, s in near[n]]
            blocks.append(f"<div><h4>URL <code>{html.escape(token[w].as_py())}</code></h4>"
                          f"{_table(rows, ('similar URLs', 'cosine'), 'neighbors')}</div>")
        return "<h3>Nearest neighbours</h3>" + f'<div class="grid">{"".join(blocks)}</div>'

    # -- a refresh -------------------------------------------------------------------------------
    def refresh_section(self) -> None:
        base = self.settings.get("init_from")
        if not base:
            return
        from .drift import drift_cosines

        body = [f"<p>Trained from <code>{html.escape(str(base))}</code> (--init-from).</p>"]
        meta = (self.corpus.meta.get("refresh") if self.corpus is not None else None) or {}
        if meta:
            rows = [("users", meta.get("base_docs"), meta.get("new_docs"), meta.get("grown_docs"),
                     meta.get("empty_base_docs")),
                    ("URLs", meta.get("base_vocab"), meta.get("new_words"), "—", meta.get("words_without_tokens"))]
            body.append(_table(rows, ("", "known", "new", "grown (new events)", "now without events")))
            self.figures["refresh"] = {k: meta.get(k) for k in ("base_docs", "new_docs", "grown_docs", "base_vocab",
                                                                "new_words")}
        elif self.corpus is None:
            body.append(f'<p class="note">What the refresh added is not shown: {html.escape(str(self.corpus_problem))}.'
                        "</p>")
        else:
            body.append('<p class="note">The corpus does not say what the refresh added (no <code>refresh</code> '
                        "in its corpus.json).</p>")
        try:
            cosines = drift_cosines(str(base), self.found.path)
        except UserError as exc:
            body.append(f'<p class="note">The drift is not measured: {html.escape(str(exc))}</p>')
            cosines = {}
        if cosines:
            names = {"docs": "users", "words": "URLs (input)", "words_out": "URLs"}
            fig = _figure(7, 2.8)
            ax = fig.add_subplot()
            for table, (rows, cosine) in cosines.items():
                ax.hist(cosine, bins=50, range=(-1, 1), alpha=0.6, label=f"{names[table]} ({len(cosine):,} of "
                        f"{rows:,} known)", density=True)
            ax.set(xlabel="cosine(old vector, new vector)", ylabel="density", title="How far the known keys moved")
            ax.legend(fontsize=8)
            self.figures["drift"] = {t: {"median": float(np.median(c)), "measured": len(c)}
                                     for t, (_, c) in cosines.items()}
            body.append(_fig("fig-drift", _svg(fig), "Near 1: the key kept its vector, and what was built on it "
                             "(an index, a downstream model) holds."))
        self.add("refresh", "The refresh", "".join(body))

    # -- the file --------------------------------------------------------------------------------
    def html(self) -> str:
        title = f"doc2vec-dist report: {self.shown}"
        made = datetime.now().astimezone().isoformat(timespec="seconds")
        nav = " · ".join(f'<a href="#{key}">{key}</a>' for key, _ in self.sections)
        data = json.dumps(self.figures, default=_plain).replace("</", "<\\/")
        return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n{MARKER}\n'
                f'<meta name="viewport" content="width=device-width, initial-scale=1">'
                f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
                f"<header><h1>{html.escape(title)}</h1><p>checkpoint v{self.found.version} · made {made} · {nav}</p>"
                f"</header><main>{''.join(body for _, body in self.sections)}</main>"
                f'<script type="application/json" id="figures">{data}</script></body></html>\n')


MARKER = outputs.REPORT_MARKER.decode()  # what outputs.file_kind knows a page of ours by
STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#fff}
header{background:#f4f6f8;border-bottom:1px solid #dde;padding:12px 28px}header h1{font-size:20px;margin:4px 0}
header p{margin:4px 0;color:#555}main{padding:0 28px 40px;max-width:1200px}
section{border-bottom:1px solid #eee;padding:8px 0 18px}h2{font-size:18px;margin:18px 0 8px}
h3{font-size:15px;margin:14px 0 6px}h4{font-size:14px;margin:10px 0 4px;font-weight:600}
table{border-collapse:collapse;font-size:13px;margin:4px 0 8px}td,th{border:1px solid #e2e2e2;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#fafafa}figure{margin:12px 0}figure svg,figure img{max-width:100%;
height:auto}figcaption{font-size:13px;color:#555}.note{color:#7a5a00;background:#fff8e1;padding:6px 10px}
.cols{display:flex;gap:28px;flex-wrap:wrap}.cols>div{flex:1 1 380px}.grid{display:grid;
grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:12px}code{font-size:12px;word-break:break-all}
details{margin:6px 0}
"""


def _fig(key: str, picture: str, caption: str) -> str:
    return f'<figure id="{key}">{picture}<figcaption>{html.escape(caption)}</figcaption></figure>'


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def _date(value) -> str:
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value).astimezone().strftime("%Y-%m-%d %H:%M")
    return str(value)


def _palette(names: list[str]) -> dict[str, str]:
    """The COLOURED_HOSTS most frequent hosts, each with a colour of tab10's."""
    if not names:
        return {}
    found, counts = np.unique(np.array(names, dtype=object), return_counts=True)
    top = [str(found[i]) for i in np.argsort(-counts, kind="stable")[:COLOURED_HOSTS]]
    colours = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
    return dict(zip(top, colours))


def _tokens_trained(lines: list[dict]) -> int:
    """The tokens the runs of a training log trained in the epochs it lists. An epoch line's `tokens` are its
    whole epoch's, but the first epoch of a run resumed from a mid-epoch checkpoint (its start line's
    resumed_from a checkpoint line's version with mid_epoch) trained only the rest of it, in its
    wall_seconds: what that run trained is its tokens_per_second × wall_seconds (run.epoch_line, which
    counts the rate from them, as train's summary counts its tokens: run._summary)."""
    mid = {line.get("version") for line in lines if line["event"] == "checkpoint" and line.get("mid_epoch")}
    partial = {line.get("run") for line in lines
               if line["event"] == "start" and line.get("resumed_from") is not None and line["resumed_from"] in mid}
    total = 0
    for line in lines:
        if line["event"] != "epoch":
            continue
        if line.get("run") in partial:
            partial.discard(line.get("run"))  # the run's first epoch line: the rest of the epoch it resumed in
            total += round(line.get("tokens_per_second", 0.0) * line.get("wall_seconds", 0.0))
        else:
            total += line.get("tokens", 0)
    return total


def _keys_of(found: ModelDir, table: str, rows: np.ndarray) -> list[str]:
    """The keys of some rows, read from the memory-mapped key file (not the 20M keys)."""
    from .modeldir import KEY_TABLES

    name, column = KEY_TABLES[table]
    with pa.memory_map(found.store.path(name)) as source:
        return [str(k) for k in pa.ipc.open_file(source).read_all().column(column).take(pa.array(rows)).to_pylist()]


def umap_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("umap") is not None


def _project(matrices: list[np.ndarray], seed: int) -> tuple[list[np.ndarray], str]:
    """Each matrix in 2-D, on its own: UMAP (cosine) where umap-learn is installed, else PCA."""
    if umap_installed():
        import umap

        return [umap.UMAP(n_components=2, metric="cosine", random_state=seed).fit_transform(m) if len(m) > 3 else
                np.zeros((len(m), 2)) for m in matrices], "UMAP"
    found = []
    for m in matrices:
        centred = m - m.mean(0) if len(m) else m
        if len(m) < 2:
            found.append(np.zeros((len(m), 2)))
            continue
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        found.append(centred @ vt[:2].T)
    return found, "PCA"


def _streamed_rows(found: ModelDir, table: str, rows: np.ndarray) -> np.ndarray:
    """Rows of a table by id, read in one pass over its parts a record batch at a time (ModelDir.batches, which
    verifies each part and drops each batch's pages once read). Not Model.gather: a sample is spread over the
    whole table, and each row read through the memory map maps a whole large folio (~1 MB here), so 2,000 users
    of a 20M-user table made 2 GiB resident; streamed, the process holds one batch."""
    wanted = np.asarray(rows, np.int64)
    order = np.argsort(wanted, kind="stable")
    ordered = wanted[order]
    out = np.zeros((len(wanted), found.spec(table)["dim"]), np.float32)
    for part in range(len(found.spec(table)["parts"])):
        for ids, vectors in found.batches(table, part):
            at = np.minimum(np.searchsorted(ordered, ids), len(ordered) - 1)
            hit = np.flatnonzero(ordered[at] == ids) if len(ordered) else np.zeros(0, np.int64)
            out[order[at[hit]]] = vectors[hit]
    return out


def _scan_words_out(found: ModelDir, user_rows: np.ndarray, seen: list[np.ndarray], prior: np.ndarray,
                    url_rows: np.ndarray, url_ids: np.ndarray, k: int) -> tuple[list, list]:
    """One pass over words_out, a record batch at a time: for each user row, the k likeliest URLs (d·o +
    log prior, as `neighbors --against words_out` ranks them) less those in `seen`; for each (unit) URL row,
    its k most similar other URLs (cosine)."""
    best_users = [(np.zeros(0, np.int64), np.zeros(0)) for _ in range(len(user_rows))]
    best_urls = [(np.zeros(0, np.int64), np.zeros(0)) for _ in range(len(url_rows))]
    excluded = [np.asarray(s, np.int64) for s in seen]

    def keep(best, ids, scores):
        ids_all, scores_all = np.concatenate([best[0], ids]), np.concatenate([best[1], scores])
        top = np.argsort(-scores_all, kind="stable")[:k]
        return ids_all[top], scores_all[top]

    for part in range(len(found.spec("words_out")["parts"])):
        for ids, vectors in found.batches("words_out", part):
            if len(user_rows):
                scores = user_rows @ vectors.T + prior[ids][None, :]
                for n in range(len(user_rows)):
                    mask = ~np.isin(ids, excluded[n]) & np.isfinite(scores[n])
                    best_users[n] = keep(best_users[n], ids[mask], scores[n][mask])
            if len(url_rows):
                cosine = url_rows @ unit_rows(vectors).T
                for n in range(len(url_rows)):
                    mask = ids != url_ids[n]
                    best_urls[n] = keep(best_urls[n], ids[mask], cosine[n][mask])
    return ([list(zip(*b)) for b in best_users], [list(zip(*b)) for b in best_urls])


def peak_line(result: dict) -> str:
    return (f"report: {result['path']} ({result['seconds']:.1f} s, the map by {result['map']}, peak memory "
            f"{result['peak_rss_bytes'] / 2**30:.2f} GiB)")

