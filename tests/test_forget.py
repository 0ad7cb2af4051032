"""forget (issue 51, part 1): users erased from a model, its corpus, held-out file, exports and index, and
kept out of every later refresh by the forget list of salted hashes.

The erasure test is the issue's: users with unique keys planted in the sample, the day-1 job (prepare,
train, export, index, job.json) and one daily refresh; forget them in both days' outputs; then no byte
of their keys, nor of their vectors (float32, unit-normalised, bfloat16), is left under the model,
corpus, exports and index folders (nor in the model --retrain-epochs trains from day 1's without them); a refresh from logs that still hold them does not bring them back;
everyone else's vectors are the same bits, and recall is the same."""

from __future__ import annotations

import glob
import json
import os
import shutil
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import checkpoint, compact, forget, forgotten, modeldir, pipeline
from doc2vec_dist.cli import main
from doc2vec_dist.modeldir import ModelDir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAY = 86_400
PLANTED = 3


def _vector_patterns(vectors: np.ndarray) -> list[bytes]:
    """The bytes a user's vector leaves in a file: float32 as trained and unit-normalised (the index),
    and bfloat16 of both (cut and rounded: the 16-bit tables)."""
    found = []
    for row in (vectors, vectors / np.linalg.norm(vectors)):
        row = row.astype(np.float32)
        bits = row.view(np.uint32)
        found += [row.tobytes(), (bits >> 16).astype(np.uint16).tobytes(),
                  ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()]
    return found


def _find(roots: list[str], needles: dict[str, list[bytes]]) -> list[tuple[str, str]]:
    """(file, whose) for every file under `roots` that holds any of a user's byte strings."""
    hits = []
    for root in roots:
        paths = [root] if os.path.isfile(root) else [os.path.join(d, n) for d, _, ns in os.walk(root) for n in ns]
        for path in paths:
            with open(path, "rb") as fh:
                data = fh.read()
            hits += [(path, who) for who, patterns in needles.items() if any(p in data for p in patterns)]
    return hits


def _json(path: str):
    with open(path) as fh:
        return json.load(fh)


def _by_key(model: str) -> dict[str, np.ndarray]:
    found = ModelDir(model)
    return dict(zip(found.keys("docs").to_pylist(), found.read_table("docs"), strict=True))


@pytest.fixture(scope="module")
def erased(ray_cluster, tmp_path_factory):
    """The sample in three spans (day 1 before its last 5 days, day 2 the next 3, day 3 the last 2) with
    PLANTED users of unique keys (copies of busy users' events) in each, the first of them the very first
    event of day 1 (so it is id 0: job.json's example user); day 1 run by jobs/train.py, day 2 by
    jobs/refresh.py; what both held before forget, and both days forgotten."""
    root = tmp_path_factory.mktemp("erased")
    events = pa.concat_tables(pq.read_table(f) for f in sorted(glob.glob(os.path.join(ROOT, "data", "sample",
                                                                                        "events", "*.parquet"))))
    seconds = pc.cast(events["ts"], pa.int64()).to_numpy() / 1000
    last = seconds.max()
    spans = {"day1": seconds < last - 5 * DAY, "day2": (seconds >= last - 5 * DAY) & (seconds < last - 2 * DAY),
             "day3": seconds >= last - 2 * DAY}
    users = events.column("user_id").to_numpy(zero_copy_only=False)
    in_every_span = set.intersection(*(set(users[mask]) for mask in spans.values()))
    busy = [u for u, _ in sorted(((u, n) for u, n in zip(*np.unique(users, return_counts=True), strict=True)
                                  if u in in_every_span), key=lambda x: -x[1])[:PLANTED]]
    keys = [f"planted-{i}-{uuid.uuid4().hex}" for i in range(PLANTED)]
    planted = pa.concat_tables(events.filter(pc.equal(events["user_id"], u)).set_column(
        0, "user_id", pa.array([k] * int((users == u).sum()))) for u, k in zip(busy, keys, strict=True))
    planted_seconds = pc.cast(planted["ts"], pa.int64()).to_numpy() / 1000
    paths = {}
    for name, keep in spans.items():
        mine = planted.filter(pa.array({"day1": planted_seconds < last - 5 * DAY,
                                         "day2": (planted_seconds >= last - 5 * DAY) & (planted_seconds < last - 2 * DAY),
                                         "day3": planted_seconds >= last - 2 * DAY}[name]))
        paths[name] = str(root / f"{name}.parquet")
        pq.write_table(pa.concat_tables([mine, events.filter(pa.array(keep))]), paths[name])
    day1 = str(root / "day1" / "model")
    assert pipeline.train_job(["--input", paths["day1"], "--out", day1, "--time-col", "ts", "--holdout", "0.2",
                                   "--dim", "8", "--epochs", "1", "--sample", "0", "--num-ps", "2",
                                   "--cpus-per-worker", "1", "--no-progress"]) == 0
    day2 = str(root / "day2")
    assert pipeline.refresh_job(["--events", paths["day2"], "--base-model", day1, "--index",
                                     os.path.join(day1, "exports", "users.index"), "--out", day2, "--no-progress",
                                     "--recall-queries", "100"]) == 0
    corpus1 = _json(os.path.join(day1 + "-corpus", "corpus.json"))
    places = {"day1": [day1, day1 + "-corpus", corpus1["holdout_out"]], "day2": [day2]}
    # what the users left, taken before forget; and copies to compare the others with
    needles = {k: [k.encode()] for k in keys}
    for model in (day1, os.path.join(day2, "model")):
        vectors = _by_key(model)
        for k in keys:
            needles[k] += _vector_patterns(vectors[k])
    before = {"hits": _find(places["day1"] + places["day2"], needles), "day2": _by_key(os.path.join(day2, "model")),
              "day1_model": shutil.copytree(day1, str(root / "before" / "model")),
              "day1_corpus": shutil.copytree(day1 + "-corpus", str(root / "before" / "corpus")),
              "job": _json(os.path.join(day1, "exports", "job.json"))}
    with open(root / "keys.txt", "w") as fh:
        fh.write("\n".join(keys) + "\nnever-seen-user\n")
    # day 1 forgotten with a retrain (--retrain-epochs) into a model beside it, which the search covers too
    retrained = str(root / "day1-retrained")
    for model, corpus, more in ((day1, day1 + "-corpus", ["--retrain-epochs", "1", "--retrain-out", retrained,
                                                         "--no-progress"]),
                                (os.path.join(day2, "model"), os.path.join(day2, "corpus"),
                                 ["--exports", os.path.join(day2, "exports"), "--index", os.path.join(day2, "index")])):
        assert main(["forget", "--model", model, "--keys", str(root / "keys.txt"), "--corpus", corpus, *more]) == 0
    places["day1"].append(retrained)
    return {"root": root, "paths": paths, "keys": keys, "needles": needles, "places": places, "before": before,
            "day1": day1, "day2": day2, "retrained": retrained}


def test_forget_leaves_no_byte_of_the_users_keys_or_vectors(erased):
    """Before: the keys and vectors were in the model, corpus, held-out file, exports (Parquet, job.json's
    example user), index and the refresh's folders; after: nowhere."""
    before = {who for _, who in erased["before"]["hits"]}
    assert before == set(erased["keys"])
    assert erased["before"]["job"]["example"]["user"] == erased["keys"][0]  # the example user was planted
    where = {os.path.relpath(path, erased["root"]) for path, _ in erased["before"]["hits"]}
    for place in ("day1/model/checkpoints", "day1/model/exports/users.parquet", "day1/model/exports/users.index",
                  "day1/model/exports/job.json", "day1/model-corpus/docs.arrow", "day1/model-heldout.parquet",
                  "day2/model/checkpoints", "day2/corpus/docs.arrow", "day2/exports/users", "day2/index"):
        assert any(w.startswith(place) for w in where), place
    assert _find(erased["places"]["day1"] + erased["places"]["day2"], erased["needles"]) == []
    # the model keeps one version, and the forget list holds the keys' salted hashes
    for model in (erased["day1"], os.path.join(erased["day2"], "model")):
        assert os.listdir(os.path.join(model, "checkpoints")) == [f"v{modeldir.latest_version(model)}"]
        listed = forgotten.of_model(model, ModelDir(model).manifest)
        assert len(listed) == PLANTED + 1 and all(listed.holds(k) for k in erased["keys"])


def test_the_others_keep_their_vectors_bit_for_bit_and_recall_is_the_same(erased):
    from doc2vec_dist.evaluate import heldout_metrics
    from doc2vec_dist.index import ServedIndex

    day2 = os.path.join(erased["day2"], "model")
    after, before = _by_key(day2), erased["before"]["day2"]
    assert set(after) == set(before) - set(erased["keys"])
    assert all(np.array_equal(after[k], before[k]) for k in after)
    exported = pq.read_table(os.path.join(erased["day2"], "exports", "users"))
    vectors = modeldir.matrix_of(exported.column("vector"), 8)
    assert all(np.array_equal(v, after[k]) for k, v in zip(exported.column("key").to_pylist(), vectors, strict=True))
    served = ServedIndex.load(os.path.join(erased["day2"], "index"))
    ids = np.arange(served.index.ntotal)
    live = served.keys.is_valid().to_numpy(zero_copy_only=False)
    stored = served.index.reconstruct_n(0, served.index.ntotal)
    norms = {k: v / np.linalg.norm(v) for k, v in after.items()}
    assert all(np.allclose(stored[i], norms[k], atol=1e-6) for i, k in zip(ids[live], served.keys.filter(
        pa.array(live)).to_pylist(), strict=True))
    # recall of the day-1 model on the held-out pairs of those who stay: the same figures before and after
    heldout = erased["places"]["day1"][2]
    was = heldout_metrics(erased["before"]["day1_model"], heldout, corpus_path=erased["before"]["day1_corpus"])
    now = heldout_metrics(erased["day1"], heldout)
    assert was["users"] == now["users"] and was["model_recall@10"] == now["model_recall@10"], (was, now)
    assert was["model_mrr"] == now["model_mrr"]


def test_the_forgotten_model_and_corpus_agree_as_a_resume_checks_them(erased):
    # the manifest kept the tokens of the users gone: a resume on the corpus forgotten beside it was refused
    from doc2vec_dist.corpus import Corpus

    for model, corpus in ((erased["day1"], erased["day1"] + "-corpus"),
                          (os.path.join(erased["day2"], "model"), os.path.join(erased["day2"], "corpus"))):
        stats, found = ModelDir(model).manifest["corpus_stats"], Corpus(corpus)
        assert (stats["num_docs"], stats["num_tokens"], stats["vocab_size"]) == (
            found.num_docs, found.num_tokens, found.vocab_size), model


def test_retrain_epochs_trains_on_from_the_version_without_them(erased):
    """--retrain-epochs 1: a new model from the forgotten version, on the corpus without them, with every user
    that stayed and the forget list; its URL rows moved (what the others alone teach), the model left as it was."""
    from doc2vec_dist.corpus import Corpus

    day1, retrained = ModelDir(erased["day1"]), ModelDir(erased["retrained"])
    assert retrained.keys("docs").to_pylist() == day1.keys("docs").to_pylist()
    assert Corpus(erased["day1"] + "-corpus").docs().column("key").to_pylist() == day1.keys("docs").to_pylist()
    saved = retrained.config()
    assert saved.init_from == erased["day1"] and saved.epochs == 1 and saved.dim == day1.config().dim
    was, now = day1.read_table("words_out"), retrained.read_table("words_out")
    assert was.shape == now.shape and (np.abs(now - was).max(axis=1) > 0).mean() > 0.5
    assert all(forgotten.of_model(erased["retrained"], retrained.manifest).holds(k) for k in erased["keys"])
    assert os.listdir(os.path.join(erased["day1"], "checkpoints")) == [f"v{day1.version}"]


def test_a_refresh_from_logs_that_still_hold_them_does_not_bring_them_back(erased, tmp_path, capsys):
    """jobs/refresh.py with --expire-days 3 too: the users with no event in the last 3 days leave the model
    and the index with the forgotten ones, and the job says how many of each."""
    from doc2vec_dist.index import ServedIndex

    day3 = str(tmp_path / "day3")
    assert pipeline.refresh_job(["--events", erased["paths"]["day3"], "--base-model",
                                     os.path.join(erased["day2"], "model"), "--index",
                                     os.path.join(erased["day2"], "index"), "--out", day3, "--no-progress",
                                     "--recall-queries", "100", "--expire-days", "3"]) == 0
    out = capsys.readouterr().out
    refresh = _json(os.path.join(day3, "refresh.json"))["prepare"]["refresh"]
    assert f"{refresh['expired_users']:,} users and {refresh['expired_urls']:,} URLs expired (no event in 3 days)" \
        in out and refresh["expired_users"] > 0, out
    assert f"{PLANTED:,} forgotten users left out" in out, out
    assert refresh["forgotten_input_users"] == PLANTED and refresh["forgotten_input_events"] > 0
    keys = ModelDir(os.path.join(day3, "model")).keys("docs").to_pylist()
    assert not any(k in keys for k in erased["keys"])
    recent = pa.concat_tables(pq.read_table(erased["paths"][d], columns=["user_id", "ts"]) for d in ("day2", "day3"))
    seconds = pc.cast(recent["ts"], pa.int64()).to_numpy() / 1000
    assert set(keys) <= set(recent["user_id"].filter(pa.array(seconds >= seconds.max() - 3 * DAY)).to_pylist())
    served = ServedIndex.load(os.path.join(day3, "index"))
    assert sorted(served.keys.drop_null().to_pylist()) == sorted(keys)
    assert _find([day3], {k: [k.encode()] for k in erased["keys"]}) == []
    # the list goes on: into the new corpus and the new model
    for where in ("corpus", "model"):
        assert all(forgotten.ForgetList.read(os.path.join(day3, where, forgotten.FILE)).holds(k)
                   for k in erased["keys"])


def test_forget_reports_unknown_keys_and_says_what_it_changed(erased, tmp_path, capsys):
    """Running it again changes nothing and says the keys were forgotten before; an unknown key is a line,
    not an error."""
    model = shutil.copytree(erased["day1"], str(tmp_path / "model"))
    assert main(["forget", "--model", model, "--keys", str(erased["root"] / "keys.txt"), "--key", "someone-else"]) == 0
    out = capsys.readouterr().out
    assert not any(line.startswith("changed ") and "checkpoints" in line for line in out.splitlines()), out
    assert f"{PLANTED + 1} key(s) were forgotten before" in out
    assert "1 key(s) are not in the model (--key someone-else)" in out


@pytest.fixture
def small_model(small_models, tmp_path):
    """A model of 300 random users (no training), with a flat index and a Parquet export of it."""
    model = small_models.make(tmp_path / "model", seed=1)
    assert main(["index", "--model", model, "--out", str(tmp_path / "index"), "--kind", "flat", "--no-progress"]) == 0
    assert main(["export", "--model", model, "--out", str(tmp_path / "exports" / "users"), "--no-progress"]) == 0
    return model


def test_a_read_only_export_is_refused_by_name_before_anything_changes(small_model, tmp_path, tmpfs, snapshot,
                                                                       capsys):
    ro = tmpfs.mount("ro", "5m", fill=lambda path: shutil.copytree(tmp_path / "exports", os.path.join(path, "e")))
    tmpfs.remount(ro, "ro")
    before = {p: snapshot(p) for p in (small_model, str(tmp_path / "index"), ro)}
    assert main(["forget", "--model", small_model, "--key", "u7", "--exports", ro, "--index",
                 str(tmp_path / "index")]) == 2
    err = capsys.readouterr().err
    assert f"error: {ro}/e/users/part-00000.parquet: forget cannot change it (read-only file system)" in err, err
    assert {p: snapshot(p) for p in before} == before


def test_a_forget_stopped_after_its_commit_is_finished_by_running_it_again(small_model, tmp_path, monkeypatch):
    """Killed between committing the new version and moving its key file in place (and pruning): the model
    reads the old keys against the new rows until the same command runs again, which finishes it."""
    old = _by_key(small_model)

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    from doc2vec_dist.forget import Keys, forget

    with monkeypatch.context() as patched:
        patched.setattr(checkpoint, "_prune_store", stop)
        with pytest.raises(KeyboardInterrupt):
            forget(small_model, Keys(["u7", "u200"], ["--key u7", "--key u200"]), say=lambda line: None)
    assert os.path.exists(os.path.join(small_model, "docs.arrow.forget-pending"))
    assert main(["forget", "--model", small_model, "--key", "u7", "--key", "u200"]) == 0
    after = _by_key(small_model)
    assert set(after) == set(old) - {"u7", "u200"} and all(np.array_equal(after[k], old[k]) for k in after)
    assert os.listdir(os.path.join(small_model, "checkpoints")) == ["v2"]
    assert not os.path.exists(os.path.join(small_model, "docs.arrow.forget-pending"))


def test_forget_reaches_projector_exports_and_report_pages_and_says_every_version_it_removes(small_models, tmp_path,
                                                                                              capsys):
    """A projector export kept the users' points and a report page their keys, each called "not a file
    doc2vec-dist writes"; the version forget replaced was pruned unsaid; an npy export of the model after it
    put vectors on the wrong rows (its parts' ids are no longer in order); the manifest kept the tokens of the
    users gone, so a resume on the corpus forgotten beside it was refused."""
    model = small_models.make(tmp_path / "model", seed=1)
    rows = 300
    matrix = np.random.default_rng(5).standard_normal((rows, small_models.DIM)).astype(np.float32)
    ids = np.arange(rows)
    version = checkpoint.next_version(model)  # v2: three parts (row r in part r % 3), as three servers write it
    parts = [checkpoint.write_slice(model, version, "docs", p, 3, ids[p::3], matrix[p::3]) for p in range(3)]
    checkpoint.commit(model, version, {"docs": parts}, {"docs": small_models.DIM},
                      {"corpus_stats": {"num_docs": rows, "num_tokens": rows, "vocab_size": 0}}, keep=3)
    vocab = pa.table({"token": pa.array([], pa.string()), "count": pa.array([], pa.int64()),
                      "id": pa.array([], pa.int32())})
    with pa.OSFile(os.path.join(model, "vocab.arrow"), "wb") as sink, pa.ipc.new_file(sink, vocab.schema) as writer:
        writer.write_table(vocab)  # no URL table: the projector export reads the vocabulary all the same
    exports = tmp_path / "exports"
    assert main(["export", "--model", model, "--format", "projector", "--out", str(exports / "map"),
                 "--no-progress"]) == 0
    from doc2vec_dist.outputs import REPORT_MARKER

    page, other = exports / "report.html", exports / "other.html"
    for path, key in ((page, "u7"), (other, "u8")):
        path.write_bytes(b"<!DOCTYPE html>\n<html><head>" + REPORT_MARKER + f"</head><body><code>{key}</code>"
                         "</body></html>\n".encode())
    assert main(["forget", "--model", model, "--key", "u1", "--key", "u7", "--exports", str(exports)]) == 0
    out = capsys.readouterr()
    assert "not files doc2vec-dist writes" not in out.err, out.err
    after = _by_key(model)
    assert set(after) == {f"u{i}" for i in range(rows)} - {"u1", "u7"}
    # the projector export without their points, line for line
    meta = (exports / "map" / "metadata.tsv").read_text().splitlines()
    shown = [line.split("\t")[0] for line in meta[1:]]
    tensors = (exports / "map" / "tensors.tsv").read_text().splitlines()
    assert len(shown) == len(tensors) == rows - 2 and not {"u1", "u7"} & set(shown)
    assert all(np.array_equal(np.array(t.split("\t"), np.float32), after[k]) for k, t in zip(shown, tensors))
    # the page that named one removed, and said; the other kept
    assert not page.exists() and f"removed {page}" in out.out and other.exists()
    # every version it replaced said (v2 too, pruned by the commit)
    for v in (1, 2):
        assert f"removed {modeldir.version_dir(model, v)}" in out.out
    # the model's manifest counts the tokens that stay
    assert ModelDir(model).manifest["corpus_stats"]["num_tokens"] == rows - 2
    # an npy export of it: every row where its key says
    assert main(["export", "--model", model, "--format", "npy", "--out", str(tmp_path / "u.npy"),
                 "--no-progress"]) == 0
    vectors, keys = np.load(tmp_path / "u.npy"), pq.read_table(tmp_path / "u.keys.parquet")["key"].to_pylist()
    assert len(keys) == rows - 2 and all(np.array_equal(vectors[i], after[k]) for i, k in enumerate(keys))


def test_a_keys_file_s_byte_order_mark_is_not_part_of_its_first_key(tmp_path):
    """A keys file saved by a Windows editor or Excel starts with U+FEFF: its first key was read as
    '\\ufeffKEY', reported 'not in the model' and never erased, with exit 0. CRLF and spaces are stripped."""
    path = tmp_path / "keys.txt"
    path.write_bytes(b"\xef\xbb\xbfu7e3fe71f0bff\r\nuc695255bb992 \r\n\r\n")
    keys = forget.read_keys(str(path), None)
    assert keys.values == ["u7e3fe71f0bff", "uc695255bb992"]
    assert keys.where == [f"line 1 of {path}", f"line 2 of {path}"]


def test_ids_close_up_in_order():
    dropped = np.array([2, 5, 6])
    new = compact.new_ids(np.arange(9), dropped)
    assert new.tolist() == [0, 1, -1, 2, 3, -1, -1, 4, 5]
    assert compact.old_ids(np.arange(6), dropped).tolist() == [0, 1, 3, 4, 7, 8]
