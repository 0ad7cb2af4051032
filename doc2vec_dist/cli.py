"""The `doc2vec-dist` console script: parses flags and calls the library. Nothing else lives here."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from .config import PrepareConfig, TrainConfig, build, explicit_values, load_yaml
from .errors import UserError


def _add_config_flags(parser: argparse.ArgumentParser, cls) -> None:
    """One flag per config field, named like the YAML key; unset flags stay None so YAML is not overridden."""
    for f in dataclasses.fields(cls):
        if not f.metadata.get("flag", True):
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} (default: {f.default})"
        if str(f.type).startswith("bool"):
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
            continue
        kind = str(f.type)
        conv = int if kind.startswith("int") else float if kind.startswith("float") else str
        parser.add_argument(flag, type=conv, default=None, choices=f.metadata.get("choices"), help=help_text)


def _train_config(args) -> TrainConfig:
    yaml_values = load_yaml(args.config) if args.config else {}
    config = build(TrainConfig, yaml_values, vars(args))
    if getattr(args, "no_progress", False):
        config.progress = False
    return config.validate()


def cmd_generate(args) -> None:
    from .synthetic import generate

    summary = generate(args.out, args.users, args.urls, seed=args.seed, communities=args.communities,
                       events_per_user=args.events_per_user, progress=not args.no_progress)
    print(json.dumps(summary, indent=2))


def cmd_prepare(args) -> None:
    from .corpus import prepare

    yaml_values = load_yaml(args.config) if args.config else {}
    cfg = build(PrepareConfig, yaml_values, vars(args))
    corpus = prepare(args.inputs, args.out, format=cfg.format, doc_col=cfg.doc_col, token_col=cfg.token_col,
                     time_col=cfg.time_col, min_count=cfg.min_count, max_vocab=cfg.max_vocab,
                     holdout=cfg.holdout, holdout_out=cfg.holdout_out, seed=args.seed,
                     num_shards=args.num_shards, overwrite=args.overwrite, progress=not args.no_progress,
                     report=True)  # what was skipped and why goes to stderr even with --no-progress
    print(f"corpus {corpus.path}: {corpus.num_docs:,} docs, {corpus.num_tokens:,} tokens, "
          f"{corpus.vocab_size:,} words")


def cmd_train(args) -> None:
    from .trainer import resumed_config, train

    config = _train_config(args)
    if config.resume:  # the checkpoint's config, changed only where a flag or the YAML says so
        yaml_values = load_yaml(args.config) if args.config else {}
        config = resumed_config(args.out, explicit_values(TrainConfig, yaml_values, vars(args)))
        config.progress = not args.no_progress
    summary = train(args.corpus, args.out, config, overwrite=args.overwrite)
    _print_summary("doc2vec-dist", summary)


def cmd_baseline(args) -> None:
    from .baseline import train_gensim

    summary = train_gensim(args.corpus, args.out, _train_config(args), workers=args.workers, overwrite=args.overwrite)
    _print_summary("gensim", summary)


def _print_summary(who: str, s: dict) -> None:
    print(f"{who}: {s['tokens']:,} tokens in {s['train_seconds']:.1f}s = {s['tokens_per_second'] / 1e6:.3f}M tokens/s; "
          f"checkpoint {s['checkpoint_seconds']:.1f}s")
    if s.get("worker_seconds"):
        from .trainer import time_split

        print("worker time: " + time_split(s["worker_seconds"]))


def cmd_plan(args) -> None:
    from .plan import format_plan, plan, save_json

    result = plan(args.corpus, _train_config(args), calibrate_seconds=args.calibrate_seconds, workdir=args.workdir,
                  run_calibration=not args.no_calibrate)
    print(format_plan(result))
    if args.json:
        save_json(args.json, result)
        print(f"saved {args.json}")


def cmd_export(args) -> None:
    from .export import export

    r = export(args.model, args.table, args.out, format=args.format, progress=not args.no_progress,
               normalize=args.normalize, dtype=args.dtype)
    print(f"exported {r['rows']:,} rows of {r['table']} to {r['path']} in {r['seconds']:.2f}s "
          f"({r['rows_per_second']:,.0f} rows/s, {r['parts']} parts, peak memory {r['peak_rss_bytes'] / 2**30:.2f} GiB)")


def cmd_index(args) -> None:
    from .export import calm_openmp

    calm_openmp()  # before faiss is imported
    from .index import build_index, summary_line

    params = build_index(args.out, kind=args.kind, model=args.model, table=args.table, vectors_path=args.vectors,
                         progress=not args.no_progress, report=False, recall_queries=args.recall_queries)
    print(summary_line(params))


def cmd_neighbors(args) -> None:
    from .export import calm_openmp

    calm_openmp()  # before faiss is imported
    from .index import neighbors

    keys = list(args.key or [])
    if args.keys_file:
        import pyarrow.parquet as pq

        try:
            names = pq.read_schema(args.keys_file).names
        except (OSError, ValueError) as exc:
            raise UserError(f"{args.keys_file}: cannot read it as Parquet ({str(exc).splitlines()[0]})") from None
        if "key" not in names:
            raise UserError(f"{args.keys_file}: cannot read a 'key' column (it has: {', '.join(names)})")
        keys += [str(k) for k in pq.read_table(args.keys_file, columns=["key"]).column("key").to_pylist()]
    if not keys:
        raise UserError("give --key KEY (repeatable) or --keys-file FILE")
    result = neighbors(args.model, keys, k=args.k, table=args.table, against=args.against, index=args.index)
    if args.out:
        import pyarrow.parquet as pq

        pq.write_table(result, args.out)
        print(f"wrote {result.num_rows} rows to {args.out}")
        return
    for row in result.to_pylist():
        print(f"{row['key']}\t{row['rank']}\t{row['neighbor']}\t{row['score']:.4f}")


def cmd_evaluate(args) -> None:
    from .evaluate import heldout_metrics, labels_metrics, pairs_metrics, save_and_print

    if args.heldout:
        save_and_print(args.model, "heldout", heldout_metrics(args.model, args.heldout, k=args.k))
    elif args.pairs:
        save_and_print(args.model, "pairs", pairs_metrics(args.model, args.pairs))
    elif args.labels:
        save_and_print(args.model, "labels", labels_metrics(args.model, args.labels, k=args.k, key_col=args.key_col,
                                                            label_col=args.label_col))
    else:
        raise UserError("give --heldout FILE, --pairs FILE or --labels FILE")


def cmd_infer(args) -> None:
    from .infer import infer

    r = infer(args.model, args.inputs, args.out, format=args.format, doc_col=args.doc_col, token_col=args.token_col,
              time_col=args.time_col, epochs=args.epochs, alpha=args.alpha, min_alpha=args.min_alpha, seed=args.seed,
              batch_users=args.batch_users, progress=not args.no_progress, tmp_dir=args.tmp_dir)
    print(f"inferred {r['rows']:,} user vectors (dim {r['dim']}) to {r['path']} in {r['seconds']:.2f}s "
          f"({r['users_per_second']:,.0f} users/s)")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="doc2vec-dist", description="Distributed doc2vec for users × URLs on Ray.")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name, func, help_text):
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.set_defaults(func=func)
        sp.add_argument("--no-progress", action="store_true", help="no progress bars")
        return sp

    g = add("generate", cmd_generate, "synthetic browsing logs with known communities")
    g.add_argument("--users", type=int, required=True)
    g.add_argument("--urls", type=int, required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--communities", type=int, default=8)
    g.add_argument("--events-per-user", type=float, default=30.0)

    pr = add("prepare", cmd_prepare, "events, lists or text → corpus (vocabulary, ids, shard files)")
    pr.add_argument("inputs", nargs="+", help="files, directories or globs")
    pr.add_argument("--out", required=True, help="corpus directory to create")
    pr.add_argument("--config", help="YAML file with the same keys as the flags")
    _add_config_flags(pr, PrepareConfig)
    pr.add_argument("--seed", type=int, default=1, help="seed of the held-out split (default: 1)")
    pr.add_argument("--num-shards", type=int, default=None, help="shard files to write (default: from size)")
    pr.add_argument("--overwrite", action="store_true", help="replace an existing corpus")

    for name, func, text in (("train", cmd_train, "train on Ray: parameter servers + workers"),
                             ("baseline", cmd_baseline, "train gensim's Doc2Vec on the same corpus, same layout")):
        t = add(name, func, text)
        t.add_argument("--corpus", required=True)
        t.add_argument("--out", required=True, help="model directory")
        t.add_argument("--config", help="YAML file with the same keys as the flags")
        t.add_argument("--overwrite", action="store_true", help="replace an existing model")
        _add_config_flags(t, TrainConfig)
        if name == "baseline":
            t.add_argument("--workers", type=int, default=None, help="gensim threads (default: all cores)")

    pl = add("plan", cmd_plan, "memory per parameter server, worker and node, and time per epoch, before training "
                               "(corpus statistics and a short calibration run on a slice of the corpus)")
    pl.add_argument("--corpus", required=True)
    pl.add_argument("--config", help="YAML file with the same keys as the flags")
    _add_config_flags(pl, TrainConfig)
    pl.add_argument("--calibrate-seconds", type=float, default=30.0,
                    help="about how long the calibration run trains (default: 30)")
    pl.add_argument("--no-calibrate", action="store_true", help="memory only, from modelled fixed costs; no time")
    pl.add_argument("--workdir", help="where the calibration slice and model go, removed after (default: the "
                                      "system's temp dir; on a cluster, storage every node sees)")
    pl.add_argument("--json", help="also write the plan as JSON to this file")

    e = add("export", cmd_export, "write a table as Parquet (key, vector), word2vec text or npy")
    e.add_argument("--model", required=True)
    e.add_argument("--table", default="docs", choices=("docs", "words", "words_out"))
    e.add_argument("--out", required=True)
    e.add_argument("--format", default="parquet", choices=("parquet", "word2vec", "npy"))
    e.add_argument("--normalize", action="store_true", help="scale vectors to unit length")
    e.add_argument("--dtype", default="float32", choices=("float32", "float16"), help="vector element type")

    i = add("index", cmd_index, "build a faiss cosine index of a table or a (key, vector) Parquet")
    i.add_argument("--model")
    i.add_argument("--table", default="docs", choices=("docs", "words", "words_out"))
    i.add_argument("--vectors", help="Parquet with key, vector (instead of --model)")
    i.add_argument("--out", required=True)
    i.add_argument("--kind", default="auto", choices=("flat", "hnsw", "ivfpq", "auto"),
                   help="auto: flat up to 1M rows, else ivfpq (re-ranked exactly) (default: auto)")
    i.add_argument("--recall-queries", type=int, default=1000,
                   help="sampled rows whose recall@10 vs exact search is measured (default: 1000)")

    n = add("neighbors", cmd_neighbors, "similar users for a user, likeliest URLs for a user (--against words_out), "
                                        "similar URLs for a URL (--table words_out)")
    n.add_argument("--model", required=True)
    n.add_argument("--key", action="append", help="query key (repeatable)")
    n.add_argument("--keys-file", help="Parquet with a key column of queries")
    n.add_argument("--table", default="docs", choices=("docs", "words", "words_out"))
    n.add_argument("--against", choices=("docs", "words", "words_out"), help="table searched (default: --table)")
    n.add_argument("--k", type=int, default=10)
    n.add_argument("--index", help="search this saved index (from `index`) instead of an exact scan")
    n.add_argument("--out", help="write key, neighbor, score, rank to this Parquet instead of printing")

    inf = add("infer", cmd_infer, "vectors for new users from their events, with the model's words_out frozen "
                                   "(gensim's infer_vector, batched); writes Parquet key, vector")
    inf.add_argument("--model", required=True)
    inf.add_argument("inputs", nargs="+", help="events of the new users: files, directories or globs, as for prepare")
    inf.add_argument("--out", required=True, help="Parquet file to write (key, vector)")
    prep = {f.name: f for f in dataclasses.fields(PrepareConfig)}
    for name in ("format", "doc_col", "token_col", "time_col"):
        f = prep[name]
        inf.add_argument("--" + name.replace("_", "-"), default=f.default, choices=f.metadata.get("choices"),
                         help=f"{f.metadata['help']} (default: {f.default})")
    inf.add_argument("--epochs", type=int, help="passes over each user's events (default: the model's epochs)")
    inf.add_argument("--alpha", type=float, help="initial learning rate (default: the model's alpha)")
    inf.add_argument("--min-alpha", type=float, help="final learning rate (default: the model's min_alpha)")
    inf.add_argument("--seed", type=int, default=1, help="seed of start vectors and draws; same seed, same vectors "
                                                        "(default: 1)")
    inf.add_argument("--batch-users", type=int, default=4096, help="users trained together; bounds memory "
                                                                   "(default: 4096)")
    inf.add_argument("--tmp-dir", help="where the events are staged while read (default: the system's temp dir)")

    ev = add("evaluate", cmd_evaluate, "held-out URL prediction or correlation with human similarity")
    ev.add_argument("--model", required=True)
    ev.add_argument("--heldout", help="Parquet of hidden (key, token) pairs from prepare --holdout")
    ev.add_argument("--pairs", help="human similarity: square matrix (Lee format) or key1, key2, score")
    ev.add_argument("--labels", help="Parquet/CSV of key, label: k-NN label accuracy on a fixed split")
    ev.add_argument("--key-col", default="key", help="key column of --labels (default: key)")
    ev.add_argument("--label-col", default="label", help="label column of --labels (default: label)")
    ev.add_argument("--k", type=int, default=10)
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        args.func(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
