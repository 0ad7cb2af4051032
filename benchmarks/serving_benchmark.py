"""Serving benchmark: export, index builds, recall@10 vs exact and batch query throughput.

    nice -n 10 python benchmarks/serving_benchmark.py --rows 1000000 --work /tmp/serving-1m
    nice -n 10 python benchmarks/serving_benchmark.py --rows 20000000 --steps export,auto --work /tmp/serving-20m --clean
    python benchmarks/serving_benchmark.py --rows 1000000 --steps ivfpq,update --changed 0.4 --new 0.02   # daily refresh

WORK is the benchmark's own: a new or empty directory, which it marks as its own (`.doc2vec-dist.json`),
or one it marked before (its model is reused when the sizes fit). A folder it did not make is refused,
since its steps replace what they find under their names (model, users, index-*) and --clean deletes
them; --clean deletes only those, and WORK itself once empty.

It writes a model directory in the checkpoint layout (a `docs` table of --rows × --dim, sharded over
--parts parts as a model trained with that many parameter servers is: row r in part r % parts),
then runs each step as its own process through the command line (`doc2vec-dist export`, `index`)
or this script (`query`), so the peak memory reported (os.wait4's ru_maxrss) is that step's alone.
Figures are printed, and saved as WORK/results.json.

The update step stands for a daily refresh (issue 17): a second model whose first rows are the
first one's, --changed of them moved a little (cosine ~0.98 with their old vector, what one refresh
epoch does) and --new rows after them; the IVF-PQ index of the first model is updated to it
(`index --update`) and, beside it, one is built from scratch (`index --kind ivfpq`): time and
recall@10 vs exact of each.

The vectors are synthetic users with planted clusters: a shared mean, one of --clusters centres
(a decaying spectrum over the dims), and isotropic noise. With the defaults their statistics are
close to those of a real model (1M users, dim 100, trained by doc2vec-dist on synthetic browsing
logs): top-10 principal components explain ~50% of the variance (real: 48%), the nearest other
user has cosine ~0.76 and the 10th ~0.72 (real: 0.74 / 0.71), random pairs 0.19 ± 0.21 (0.26 ± 0.26).
Near-equal neighbours like these are what makes approximate search hard; a table of tight,
well-separated clusters would flatter every index.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # runs from a checkout without installing the package

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from doc2vec_dist import checkpoint, modeldir, outputs
from doc2vec_dist.errors import UserError
from doc2vec_dist.logs import command
from doc2vec_dist.memwatch import peak_rss_bytes, proc_status_bytes

STEPS = ("export", "flat", "hnsw", "ivfpq", "auto", "query", "update")
WORK_KIND = "serving-benchmark"  # outputs.DIR_KINDS: the entries a benchmark writes in WORK


# ---------------------------------------------------------------------------------------------------
# WORK: the benchmark's own directory
# ---------------------------------------------------------------------------------------------------

def claim_work(work: str) -> None:
    """Make `work` the benchmark's, before anything is written: a new or empty directory is created
    and marked; one marked before is taken as it is. Anything else is a folder of the user's, refused
    in one line naming what it holds: the steps replace what they find under their names there."""
    if os.path.isdir(work) and os.listdir(work):
        names = sorted(os.listdir(work))
        kind = None
        if outputs.MARKER in names:
            with open(os.path.join(work, outputs.MARKER), "rb") as fh:
                kind = outputs.read_marker_kind(fh.read(4096))
        if kind != WORK_KIND:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise UserError(f"--work {work}: holds {shown}, and this benchmark did not make it; give a new or empty "
                            "directory (the benchmark replaces what it finds under its own names there, and --clean "
                            "deletes them)")
        return
    if os.path.lexists(work) and not os.path.isdir(work):
        raise UserError(f"--work {work}: exists and is a file; give a new or empty directory")
    outputs.check_writable(work, inside=True)
    os.makedirs(work, exist_ok=True)
    outputs.write_marker(work, WORK_KIND)


def clean_work(work: str) -> list[str]:
    """Delete what a benchmark writes in `work` (outputs.DIR_KINDS[WORK_KIND]), the marker last, then
    `work` itself if nothing else is left in it; returns what stayed (someone else's)."""
    names = sorted(os.listdir(work))
    for name in [n for n in names if n != outputs.MARKER and outputs.owned(WORK_KIND, n)] + [outputs.MARKER]:
        if os.path.lexists(os.path.join(work, name)):
            outputs.remove_path(os.path.join(work, name))
    left = os.listdir(work)
    if not left:
        os.rmdir(work)
    return sorted(left)
KEY_SCHEMA = pa.schema([("key", pa.string()), ("id", pa.int64()), ("length", pa.int64())])


# ---------------------------------------------------------------------------------------------------
# the synthetic model
# ---------------------------------------------------------------------------------------------------

def synthetic_rows(n: int, dim: int, rng: np.random.Generator, centers: np.ndarray, mean: np.ndarray,
                   noise: float) -> np.ndarray:
    which = rng.integers(0, len(centers), n)
    return mean + centers[which] + noise * rng.standard_normal((n, dim), dtype=np.float32)


def write_model(model: str, rows: int, dim: int = 100, parts: int = 4, clusters: int = 1000, noise: float = 0.8,
                seed: int = 0, chunk: int = 1 << 20) -> str:
    """A model directory with a `docs` table only, written with checkpoint.write_slice and commit."""
    if os.path.exists(os.path.join(model, "LATEST")):
        spec = modeldir.ModelDir(model).spec("docs")
        if (spec["rows"], spec["dim"], len(spec["parts"])) == (rows, dim, parts):
            print(f"model: reusing {model}", file=sys.stderr)
            return model
    if os.path.exists(model):  # inside the benchmark's own WORK (claim_work): an earlier run's model
        shutil.rmtree(model)
    os.makedirs(model)
    rng = np.random.default_rng(seed)
    spectrum = (np.arange(1, dim + 1) ** -0.8).astype(np.float32)
    spectrum /= np.sqrt((spectrum ** 2).sum() / dim)
    mean = rng.standard_normal(dim).astype(np.float32) * 0.6
    centers = rng.standard_normal((clusters, dim)).astype(np.float32) * spectrum
    _write_keys(model, rows, chunk)
    entries = []
    for s in range(parts):
        ids = np.arange(s, rows, parts, dtype=np.int64)
        matrix = np.empty((len(ids), dim), np.float32)
        for start in range(0, len(ids), chunk):
            n = min(chunk, len(ids) - start)
            matrix[start:start + n] = synthetic_rows(n, dim, np.random.default_rng([seed, s, start]), centers, mean,
                                                     noise)
        entries.append(checkpoint.write_slice(model, 1, "docs", s, parts, ids, matrix))
        del matrix
        print(f"model: part {s + 1}/{parts} written", file=sys.stderr)
    checkpoint.commit(model, 1, {"docs": entries}, {"docs": dim}, {"trainer": "synthetic"}, keep=1)
    return model


def write_refreshed_model(model: str, out: str, changed: float, new: int, noise: float = 0.8, seed: int = 7) -> str:
    """`model`'s docs with a `changed` share of its rows moved a little and `new` rows appended, as a
    refreshed model (same keys, same ids, new ones after), in as many parts."""
    found = modeldir.ModelDir(model)
    spec = found.spec("docs")
    rows, dim, parts = spec["rows"] + new, spec["dim"], len(spec["parts"])
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    table = found.read_table("docs")
    rng = np.random.default_rng(seed)
    moved = rng.random(len(table)) < changed
    # one refresh epoch moves a known user a little: cosine ~0.98 with where it was
    table[moved] += 0.2 * noise * rng.standard_normal((int(moved.sum()), dim), dtype=np.float32)
    fresh = table[rng.integers(0, len(table), new)] + noise * rng.standard_normal((new, dim), dtype=np.float32)
    table = np.concatenate([table, fresh])
    _write_keys(out, rows, 1 << 20)
    entries = [checkpoint.write_slice(out, 1, "docs", s, parts, np.arange(s, rows, parts, dtype=np.int64),
                                      np.ascontiguousarray(table[s::parts])) for s in range(parts)]
    # a refresh is trained --init-from the model: it says so, and the model's index may be updated to it
    lineage = [found.manifest["model_id"]] if found.manifest.get("model_id") else []
    checkpoint.commit(out, 1, {"docs": entries}, {"docs": dim},
                      {"trainer": "synthetic refresh", **({"derived_from": lineage} if lineage else {})}, keep=1)
    return out


def _write_keys(model: str, rows: int, chunk: int) -> None:
    """docs.arrow (user keys in id order) and a one-word vocab.arrow, as prepare writes them."""
    with pa.OSFile(os.path.join(model, "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, KEY_SCHEMA) as writer:
        for start in range(0, rows, chunk):
            ids = pa.array(np.arange(start, min(start + chunk, rows), dtype=np.int64))
            keys = pc.binary_join_element_wise("u", pc.cast(ids, pa.string()), "")
            writer.write_batch(pa.record_batch([keys, ids, pa.array(np.ones(len(ids), np.int64))], schema=KEY_SCHEMA))
    vocab = pa.table({"token": ["https://example.com/"], "count": pa.array([1], pa.int64()),
                      "id": pa.array([0], pa.int32())})
    with pa.OSFile(os.path.join(model, "vocab.arrow"), "wb") as sink, pa.ipc.new_file(sink, vocab.schema) as writer:
        writer.write_table(vocab)
    with open(os.path.join(model, "config.json"), "w") as fh:
        json.dump({"ns_exponent": 0.75, "trainer": "synthetic"}, fh)


# ---------------------------------------------------------------------------------------------------
# steps, each in its own process
# ---------------------------------------------------------------------------------------------------

def popen_wait4(argv: list[str]) -> dict:
    """Run a step: wall time, CPU time (os.wait4), its peak memory, and its stdout.

    Memory is sampled from /proc/PID/status while the step runs: peak private memory (RssAnon) and
    peak resident memory (VmHWM, which also counts file pages mapped from the page cache, such as
    the IVF-PQ re-rank vectors). wait4's ru_maxrss is no use here: a child started with vfork and
    exec inherits this process's own peak in it.
    """
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, text=True)
        private = resident = 0
        while True:
            private = max(private, proc_status_bytes("RssAnon", proc.pid) or 0)
            resident = max(resident, proc_status_bytes("VmHWM", proc.pid) or 0)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if proc.returncode != 0:
        raise SystemExit(f"step failed ({proc.returncode}): {' '.join(argv)}\n{text[-3000:]}")
    # CPU seconds say what the step costs whatever else the machine was running
    return {"seconds": round(time.perf_counter() - t0, 2), "stdout": text.strip(),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_private_gib": round(private / 2**30, 2), "peak_resident_gib": round(resident / 2**30, 2)}


def memory(r: dict) -> str:
    return f"peak memory {r['peak_private_gib']} GiB private / {r['peak_resident_gib']} GiB resident"


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "doc2vec_dist", *args, "--no-progress"]


def du(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def step_export(work: str, model: str, keep: bool) -> dict:
    out = os.path.join(work, "users")
    r = popen_wait4(cli("export", "--model", model, "--table", "docs", "--out", out))
    r["rows_per_second"] = float(r["stdout"].split("(")[1].split(" rows/s")[0].replace(",", ""))
    r["output_gib"] = round(du(out) / 2**30, 2)
    r["files"] = len(os.listdir(out))
    if not keep:
        shutil.rmtree(out)
    return r


def step_index(work: str, model: str, kind: str) -> dict:
    out = os.path.join(work, f"index-{kind}")
    r = popen_wait4(cli("index", "--model", model, "--table", "docs", "--kind", kind, "--out", out))
    with open(os.path.join(out, "params.json")) as fh:
        params = json.load(fh)
    r.update({k: params[k] for k in ("kind", "recall_at_10_vs_exact", "search", "index_bytes", "vectors_bytes",
                                     "stage_seconds", "nlist", "pq_m", "train_rows") if k in params})
    r["disk_gib"] = round(du(out) / 2**30, 3)
    return r


def step_update(work: str, model: str, changed: float, new: int) -> dict:
    """The base's IVF-PQ index updated to a refreshed model, against one built from scratch on it."""
    refreshed = write_refreshed_model(model, os.path.join(work, "model-refreshed"), changed, new)
    results = {"changed": changed, "new": new}
    for name, argv in (("update", cli("index", "--update", os.path.join(work, "index-ivfpq"), "--model", refreshed,
                                      "--table", "docs", "--out", os.path.join(work, "index-updated"))),
                       ("rebuild", cli("index", "--model", refreshed, "--table", "docs", "--kind", "ivfpq", "--out",
                                       os.path.join(work, "index-rebuilt")))):
        r = popen_wait4(argv)
        with open(os.path.join(work, f"index-{name}d" if name == "update" else "index-rebuilt", "params.json")) as fh:
            params = json.load(fh)
        r.update({k: params[k] for k in ("recall_at_10_vs_exact", "search", "stage_seconds", "update") if k in params})
        results[name] = r
    results["ratio"] = round(results["update"]["seconds"] / results["rebuild"]["seconds"], 3)
    return results


def step_query(model: str, index: str, queries: int, k: int = 10, seed: int = 5) -> dict:
    """In this (child) process: batch neighbour queries on a saved index, by vector and by key."""
    from doc2vec_dist.runners import calm_openmp

    calm_openmp()  # as the command line does, before faiss is imported
    from doc2vec_dist import Model
    from doc2vec_dist.index import exact_top_k, without_self
    from doc2vec_dist.scoring import unit_rows

    m = Model.load(model)
    served = m.saved_index(index)
    keys = m.keys("docs")
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(keys), queries, replace=False)
    query_keys = keys.take(pa.array(rows)).to_pylist()
    vectors = unit_rows(m.vectors(query_keys))
    served.search(vectors[:1000], k + 1)  # page in the index and re-rank vectors once, as a server would

    t = time.perf_counter()
    _, found = served.search(vectors, k + 1)
    by_vector = queries / (time.perf_counter() - t)
    t = time.perf_counter()
    table = m.neighbors(query_keys, k=k, index=index)
    by_key = queries / (time.perf_counter() - t)
    assert table.num_rows == queries * k

    # recall of what was served, against exact search, on the first 1000 queries
    n = min(1000, queries)
    vec_path = os.path.join(index, "vectors.npy")
    if os.path.exists(vec_path):
        position = pc.index_in(pa.array(query_keys[:n]), value_set=served.keys).to_numpy()
        truth = exact_top_k(vec_path, served.index.ntotal, vectors[:n], k + 1)
        got, want = without_self(found[:n], position, k), without_self(truth, position, k)
        recall = round(float(np.mean([len(set(g.tolist()) & set(w.tolist())) / k for g, w in zip(got, want)])), 4)
    else:
        recall = None
    return {"queries": queries, "by_vector_qps": round(by_vector), "by_key_qps": round(by_key),
            "recall_at_10_served": recall, "search": served.params.get("search")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--work", default="/tmp/serving-benchmark")
    ap.add_argument("--steps", default="export,flat,ivfpq,query", help=f"comma-separated, of {', '.join(STEPS)}")
    ap.add_argument("--query-index", default="ivfpq", help="which built index the query step uses")
    ap.add_argument("--queries", type=int, default=20000)
    ap.add_argument("--changed", type=float, default=0.4, help="update: share of rows a refresh moved (default 0.4: "
                                                                 "the refresh benchmark's grown users)")
    ap.add_argument("--new", type=float, default=0.02, help="update: new rows, as a share of --rows (default 0.02)")
    ap.add_argument("--keep-export", action="store_true", help="keep the exported Parquet (it is deleted)")
    ap.add_argument("--clean", action="store_true", help="delete what the benchmark wrote in WORK (model, export, "
                                                         "indexes, results.json) at the end, and WORK once empty")
    ap.add_argument("--child-query", nargs=2, metavar=("MODEL", "INDEX"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_query:
        print(json.dumps(step_query(*args.child_query, queries=args.queries)))
        return 0

    steps = args.steps.split(",")
    if unknown := set(steps) - set(STEPS):
        ap.error(f"unknown steps: {', '.join(sorted(unknown))}")
    return command(lambda: run(args, steps))  # a refused --work is one `error:` line, exit status 2


def run(args: argparse.Namespace, steps: list[str]) -> None:
    claim_work(args.work)
    results: dict = {"rows": args.rows, "dim": args.dim, "parts": args.parts, "cores": os.cpu_count()}
    model = os.path.join(args.work, "model")
    t = time.perf_counter()
    write_model(model, args.rows, args.dim, args.parts, args.clusters)
    results["model"] = {"seconds": round(time.perf_counter() - t, 1), "disk_gib": round(du(model) / 2**30, 2),
                        "peak_rss_gib": round(peak_rss_bytes() / 2**30, 2)}
    print(f"model: {args.rows:,} × {args.dim} in {args.parts} parts, {results['model']['disk_gib']} GiB, written "
          f"in {results['model']['seconds']}s with peak RSS {results['model']['peak_rss_gib']} GiB", flush=True)

    for step in steps:
        load_before = os.getloadavg()[0]  # other work on the machine moves every figure; say how much there was
        if step == "export":
            r = step_export(args.work, model, args.keep_export)
            print(f"export parquet: {r['rows_per_second']:,.0f} rows/s, {r['seconds']}s wall, "
                  f"{r['cpu_seconds']} CPU-s, {memory(r)}, {r['output_gib']} GiB in {r['files']} files", flush=True)
        elif step == "update":
            r = step_update(args.work, model, args.changed, int(args.new * args.rows))
            u = r["update"]
            print(f"index update (ivfpq, {args.changed:.0%} of rows moved, {r['new']:,} new): {u['seconds']}s against "
                  f"a rebuild's {r['rebuild']['seconds']}s (ratio {r['ratio']}); recall@10 vs exact "
                  f"{u['recall_at_10_vs_exact']:.3f} against {r['rebuild']['recall_at_10_vs_exact']:.3f}; "
                  f"{u['update']}; {memory(u)}", flush=True)
        elif step == "query":
            index = os.path.join(args.work, f"index-{args.query_index}")
            r = popen_wait4([sys.executable, os.path.abspath(__file__), "--child-query", model, index,
                             "--queries", str(args.queries)])
            r.update(json.loads(r.pop("stdout").splitlines()[-1]))
            print(f"query {args.query_index}: {r['by_vector_qps']:,} queries/s by vector, {r['by_key_qps']:,} by key "
                  f"(k=10, {r['queries']:,} queries, search {r['search']}), served recall@10 vs exact "
                  f"{r['recall_at_10_served']}, {memory(r)}", flush=True)
        else:
            r = step_index(args.work, model, step)
            print(f"index {step} → {r['kind']}: {r['seconds']}s ({r['cpu_seconds']} CPU-s), recall@10 vs exact {r['recall_at_10_vs_exact']:.3f} "
                  f"(search {r.get('search')}), {r['disk_gib']} GiB on disk (index {r['index_bytes'] / 2**20:,.0f} MiB"
                  f" + re-rank vectors {r['vectors_bytes'] / 2**20:,.0f} MiB), {memory(r)}, "
                  f"stages {r['stage_seconds']}", flush=True)
        r["load_average"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
        print(f"  (1-min load average {r['load_average'][0]} before, {r['load_average'][1]} after, "
              f"{os.cpu_count()} cores)", flush=True)
        results[step] = r
    with open(os.path.join(args.work, "results.json"), "w") as fh:
        json.dump(results, fh, indent=2)
    if args.clean:
        left = clean_work(args.work)
        if left:
            print(f"--clean: left {', '.join(left)} in {args.work}, which the benchmark did not write", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
