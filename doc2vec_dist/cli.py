"""The `doc2vec-dist` console script: parses flags and calls the library; changes when a command or flag does."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
import warnings
from collections.abc import Collection

from . import outputs
from .config import (
    JobConfig,
    PrepareConfig,
    TrainConfig,
    build,
    engine_only,
    field_names,
    gensim_pointer,
    load_yaml,
)
from .errors import UserError
from .logs import command


def _help(text: str, default=None, required: bool = False) -> str:
    """A flag's help ending in what it is when not given, said once: "(required)" or "(default: X)".

    A default of None or False (a switch left off) adds nothing: where unset means something worth
    saying, the text itself says it ("(default: the model's alpha)").
    """
    if required:
        return text if "(required)" in text else f"{text} (required)"
    if default is None or default is False or default == argparse.SUPPRESS or "(default:" in text:
        return text
    return f"{text} (default: {str(default).replace('%', '%%')})"


class _HelpFormatter(argparse.HelpFormatter):
    """Shows every flag's default (or that it is required) through _help, so no help text spells it out."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return _help(action.help or "", action.default, action.required and bool(action.option_strings))


class _OneSetting(argparse.Action):
    """Stores a flag that has a second name (gensim's `--vector-size` for `--dim`): two values are an error."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        named = f"_{self.dest}_given_as"  # the name it was given by: the same flag twice takes the last, as any flag
        if before is not None and before != parser.get_default(self.dest) and before != values \
                and getattr(namespace, named, option_string) != option_string:
            first, *others = self.option_strings
            raise UserError(f"{first} and {', '.join(others)} (gensim's name) are one setting, given both {before} "
                            f"and {values}; give one")
        setattr(namespace, self.dest, values)
        setattr(namespace, named, option_string)


def add_config_flags(parser: argparse.ArgumentParser, cls, engine: bool = True, skip: Collection[str] = ()) -> None:
    """One flag per config field, named like the YAML key (and its aliases, gensim's names); unset flags stay
    None so YAML is not overridden, and the help shows the field's own default. engine=False leaves out the
    fields of our Ray engine alone (config.engine_only), for `baseline`; `skip` leaves out the fields a
    command sets otherwise (jobs/refresh.py's --base-model is train's init_from)."""
    for f in dataclasses.fields(cls):
        if not f.metadata.get("flag", True) or (not engine and f.metadata.get("engine")) or f.name in skip:
            continue
        flags = ["--" + name.replace("_", "-") for name in (f.name, *f.metadata.get("aliases", ()))]
        help_text = _help(f.metadata["help"], f.default)
        if str(f.type).startswith("bool"):
            parser.add_argument(*flags, dest=f.name, action="store_true", default=None, help=help_text)
            continue
        kind = str(f.type)
        conv = int if kind.startswith("int") else float if kind.startswith("float") else str
        choices = f.metadata.get("choices")
        if choices:  # one line naming the flag for a value not among them, not argparse's usage and error
            conv, metavar = _one_of(flags[0], choices), "{" + ",".join(choices) + "}"
        parser.add_argument(*flags, dest=f.name, type=conv, default=None, metavar=metavar if choices else None,
                            help=help_text, action=_OneSetting if len(flags) > 1 else "store")


def _one_of(flag: str, choices: tuple[str, ...]):
    """A flag's argparse type that takes one of `choices`, else a UserError naming the flag and them."""
    def conv(value: str) -> str:
        if value not in choices:
            raise UserError(f"bad value for {flag}: {value!r} (choose from {', '.join(choices)})")
        return value

    return conv


# Flags a user may well give to a command that does not take them (prepare's to a trainer, gensim's names,
# the engine's to baseline), each answered in one line instead of argparse's "unrecognized arguments".
# Prepare's and the engine's flags are read off the parsers themselves, gensim's names off
# config.GENSIM_NAMES (which answers their YAML keys too); only the reasons live here.
_TRAINERS = ("train", "baseline", "plan", "tune")
_PREPARE_REASONS = {"min_count": "the vocabulary is fixed when the corpus is made",
                    "max_vocab": "the vocabulary is fixed when the corpus is made",
                    "holdout": "the held-out URLs are set aside when the corpus is made",
                    "holdout_out": "the held-out URLs are set aside when the corpus is made"}
_PREPARE_REASON = "the events are read only when the corpus is made"
_BOOL_WORDS = {"0", "1", "true", "false", "yes", "no", "on", "off"}


def _prepare_option(name: str, value, command: str, written: str | None = None) -> str:
    """The line for prepare's setting `name` (underscores) given to a trainer as a flag, or as a YAML key
    (`written`: how the line names it)."""
    flag = "--" + name.replace("_", "-")
    given = f"{flag} {value}".strip()
    return (f"{written or flag} is a prepare option ({_PREPARE_REASONS.get(name, _PREPARE_REASON)}); run doc2vec-dist prepare "
            f"INPUT... --out CORPUS {given}, then {command} --corpus CORPUS")


def _switch_with_a_value(flag: str, value: str) -> str:
    return (f"{flag} is a switch and takes no value (given {value!r}): write {flag} to turn it on, leave it out "
            "to keep it off")


def _misplaced_flag(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """One line for a flag that `argv`'s command does not take but another command does, gensim's name of
    it, or a value given to a switch."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    command = argv[0] if argv else None
    if command not in sub:
        return None
    own = sub[command]._option_string_actions
    takes_inputs = any(not a.option_strings for a in sub[command]._actions)  # a positional after a switch is fine
    for i, token in enumerate(argv[1:], start=1):
        if token == "--":
            break
        flag, eq, value = token.partition("=")
        if not flag.startswith("--"):
            continue
        following = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else ""
        if flag in own:
            if own[flag].nargs == 0 and not isinstance(own[flag], argparse._HelpAction) and (eq or (following and (not takes_inputs or following.lower() in _BOOL_WORDS))):
                return _switch_with_a_value(flag, value if eq else following)
            continue
        if not eq:
            value = following
        for name in dict.fromkeys((flag, flag.replace("_", "-"))):
            given = f"{name} {value}".strip()
            if name != flag and name in own:
                if own[name].nargs == 0:
                    return f"{flag}: flags are spelled with dashes here, and {name} is a switch that takes no value: " \
                           f"write {name} to turn it on, leave it out to keep it off"
                return f"{flag}: flags are spelled with dashes here; use {given}"
            # before prepare's: --address is both (prepare's Ray tasks, train's cluster)
            if command == "baseline" and name in sub["train"]._option_string_actions:
                threads = " (its threads: --workers)" if name in ("--num-workers", "--cpus-per-worker") else ""
                return f"{name} is a doc2vec-dist engine option; gensim's baseline does not use it{threads}"
            if command == "tune" and name == "--overwrite":  # not prepare's: tune's own --out is replaced
                return ("--overwrite: tune replaces an earlier search of its own at --out without it (and refuses "
                        "anything else there); leave --overwrite out")
            if command in _TRAINERS and name in sub["prepare"]._option_string_actions:
                return _prepare_option(name[2:].replace("-", "_"), value, command)
            pointer = gensim_pointer(name, as_flags=True)
            if command in _TRAINERS and pointer:
                return f"{flag} is gensim's name; doc2vec-dist {command} uses {pointer}"
            if command == "prepare" and name in sub["train"]._option_string_actions:
                return f"{name} is a training option; prepare only makes the corpus: doc2vec-dist train --corpus " \
                       f"CORPUS {given}"
    return None


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = make_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    message = _misplaced_flag(parser, argv)
    if message:
        raise UserError(message)
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's own usage, not the top-level one
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        sub[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _at_least_one(flag: str):
    """A flag's argparse type for a count of answers (--k): a whole number >= 1, else a UserError naming the
    flag (argparse's own error for '2.5' is a usage block, and -3 once reached faiss's assertion)."""
    def conv(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise UserError(f"bad value for {flag}: {text!r} (a whole number >= 1)")
        return value

    return conv


@contextlib.contextmanager
def _warnings_as_lines():
    """The library's ServingWarnings (what an answer left out) as `warning:` lines of their own on stderr,
    as its logged warnings are; other warnings as Python shows them."""
    from .scoring import ServingWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        if issubclass(w.category, ServingWarning):
            print(f"warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _count_or_all(text: str) -> int:
    """A flag's value that is a count, or `all` (given as 0, which the command reads as no limit)."""
    if text.strip().lower() == "all":
        return 0
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or all, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 or all, not {text}")
    return value


def _trainer_yaml(args) -> dict:
    """A trainer's --config: its keys, less those of the whole job's config (jobs/train.py). A prepare
    setting is refused with the line its flag gets, except in a whole job's config (it sets input,
    corpus or out), whose prepare keys are for jobs/train.py: then one note says they are not used here."""
    if not args.config:
        return {}
    # baseline's gensim threads are its own flag, not train's worker actors
    values = load_yaml(args.config, {"workers": "baseline's --workers N (gensim's threads), on its command line"}
                       if args.command == "baseline" else None)
    prepare_keys = [k for k in values if k in field_names(PrepareConfig) - field_names(TrainConfig)]
    if prepare_keys and not any(k in values for k in ("input", "corpus", "out")):
        name = prepare_keys[0]
        raise UserError(f"{args.config}: " + _prepare_option(name, values[name], args.command, written=name))
    if prepare_keys:
        print(f"{args.command}: {args.config}'s prepare keys ({', '.join(prepare_keys)}) are for jobs/train.py, which "
              f"makes the corpus; --corpus is used as it was made", file=sys.stderr)
    prepare_only = field_names(PrepareConfig) - field_names(TrainConfig)
    return {k: v for k, v in values.items() if k not in prepare_only | field_names(JobConfig)}


def _train_config(args, yaml_values: dict | None = None, model: str | None = None) -> TrainConfig:
    """The command's TrainConfig (pipeline.train_config, as the jobs assemble theirs); with `model`, a
    --resume is that model's checkpoint config."""
    from .pipeline import train_config

    yaml_values = _trainer_yaml(args) if yaml_values is None else yaml_values
    return train_config(yaml_values, vars(args), args.config, model=model)


def cmd_generate(args) -> None:
    from .synthetic import generate

    summary = generate(args.out, args.users, args.urls, seed=args.seed, communities=args.communities,
                       events_per_user=args.events_per_user, hub_share=args.hub_share, days=args.days,
                       churn_per_week=args.churn_per_week, progress=not args.no_progress)
    print(json.dumps(summary, indent=2))


def cmd_prepare(args) -> None:
    from .prepare import prepare

    yaml_values = load_yaml(args.config) if args.config else {}
    cfg = build(PrepareConfig, yaml_values, vars(args))
    corpus = prepare(args.inputs, args.out, cfg, overwrite=args.overwrite, progress=not args.no_progress,
                     report=True)  # what was skipped and why goes to stderr even with --no-progress
    print(f"corpus {corpus.path}: {corpus.num_docs:,} docs, {corpus.num_tokens:,} tokens, "
          f"{corpus.vocab_size:,} words")


def cmd_train(args) -> None:
    from .pipeline import trained

    summary, _ = trained(args.corpus, args.out, _train_config(args, model=args.out), overwrite=args.overwrite)
    _print_summary("doc2vec-dist", summary)
    print(f"model: {summary['model']} (checkpoint v{summary['version']})")


def cmd_baseline(args) -> None:
    from .baseline import train_gensim

    # a config file shared with `train` may set the engine's own options: gensim has no use for them
    yaml_values = _trainer_yaml(args)
    engine = {k: yaml_values.pop(k) for k in engine_only() if k in yaml_values}
    ignored = sorted(k for k, v in engine.items() if v != getattr(TrainConfig, k))
    if ignored:
        print(f"baseline: ignoring {args.config}'s doc2vec-dist engine options, which gensim does not use: "
              f"{', '.join(ignored)}", file=sys.stderr)
    config = build(TrainConfig, yaml_values, vars(args))
    config.progress = not args.no_progress
    summary = train_gensim(args.corpus, args.out, config.validate(), workers=args.workers, overwrite=args.overwrite,
                           gensim_mode=args.gensim_mode)
    _print_summary(f"gensim ({summary['gensim_mode']} mode)", summary)
    print(f"model: {summary['model']} (checkpoint v{summary['version']})")


def _print_summary(who: str, s: dict) -> None:
    print(f"{who}: {s['tokens']:,} tokens in {s['train_seconds']:.1f}s = {s['tokens_per_second'] / 1e6:.3f}M tokens/s; "
          f"checkpoint {s['checkpoint_seconds']:.1f}s")
    if s.get("worker_seconds"):
        from .run import time_split

        print("worker time: " + time_split(s["worker_seconds"]))


def cmd_plan(args) -> None:
    from .plan import plan, save_json
    from .plan_report import format_plan

    outputs.check_writable(args.json)
    if not args.no_calibrate:
        outputs.check_writable(args.workdir or tempfile.gettempdir(), inside=True)
    result = plan(args.corpus, _train_config(args), calibrate_seconds=args.calibrate_seconds, workdir=args.workdir,
                  run_calibration=not args.no_calibrate, network_gbps=args.network_gbps,
                  calibrate_workers=args.calibrate_workers, users=args.users, urls=args.urls,
                  tokens_per_user=args.tokens_per_user, gpu_model=args.gpu_model,
                  device_tokens_per_second=args.device_tokens_per_second, hbm_gb_per_second=args.hbm_gb_per_second,
                  pcie_gb_per_second=args.pcie_gb_per_second)
    print(format_plan(result))
    if args.json:
        save_json(args.json, result)
        print(f"saved {args.json}")


def cmd_tune(args) -> None:
    from .search_report import format_result
    from .search_space import load_space
    from .tune import search

    # tune's own hidden --resume and --resume-from (and --config's keys): one line, not every trial failing
    # with Ray's traceback
    afresh = "tune trains each trial and the comparison afresh in directories of its own, so there is no run to resume"
    for flag, value in (("--resume", args.resume), ("--resume-from", args.resume_from)):
        if value:
            raise UserError(f"{flag}: {afresh}; leave {flag} out (a model goes on with train --resume)")
    base = _train_config(args)
    if base.resume:
        raise UserError(f"{args.config}: resume / resume_from: {afresh}; leave them out of the base settings")
    result = search(args.corpus, args.out, heldout=args.heldout, labels=args.labels, pairs=args.pairs,
                    budget=args.budget, space=load_space(args.space) if args.space else None,
                    base=base, compare=not args.no_compare, calibrate_seconds=args.calibrate_seconds,
                    test_fraction=args.test_fraction, key_col=args.key_col, label_col=args.label_col,
                    progress=not args.no_progress, searcher=args.searcher,
                    space_name=args.space or "the search space")
    print(format_result(result, args.out))


def cmd_export(args) -> None:
    from .export import export

    if args.urls:
        _export_urls(args)
        return
    r = export(args.model, args.table, args.out, format=args.format, progress=not args.no_progress,
               normalize=args.normalize, dtype=args.dtype, sample=args.sample, seed=args.seed)
    keys = f" (keys in {r['keys_path']})" if r.get("keys_path") else ""
    print(f"exported {r['rows']:,} rows of {r['table']} to {r['path']}{keys} in {r['seconds']:.2f}s "
          f"({r['rows_per_second']:,.0f} rows/s, {r['parts']} parts, peak memory {r['peak_rss_bytes'] / 2**30:.2f} GiB)")


def _export_urls(args) -> None:
    """export --urls: vectors for the URLs listed, composed where the model never saw them."""
    from .export import export_url_vectors, read_url_list

    if args.table not in ("words_out", "words"):
        raise UserError("--urls: vectors of URLs come from a URL table: give --table words_out (or words)")
    if args.format != "parquet" or args.normalize or args.dtype != "float32":
        given = next(f for f, on in (("--format", args.format != "parquet"), ("--normalize", args.normalize),
                                     ("--dtype", args.dtype != "float32")) if on)
        raise UserError(f"--urls writes Parquet (key, vector, source, part): leave {given} out")
    r = export_url_vectors(args.model, read_url_list(args.urls), args.out, table=args.table)
    composed = sum(r["composed"].values())
    how = ", ".join(f"{n:,} from a {'path prefix' if name == 'path' else name}" for name, n in r["composed"].items())
    print(f"exported {r['rows']:,} URL vectors of {r['table']} to {r['path']}: {r['own']:,} the model's own, "
          f"{composed:,} composed" + (f" ({how})" if how else "") + f", {r['without']:,} without a vector (null) "
          f"in {r['seconds']:.2f}s")


def cmd_index(args) -> None:
    from .runners import calm_openmp

    calm_openmp()  # before faiss is imported
    from .index import build_index, summary_line
    from .index_update import update_index

    if args.update:
        params = update_index(args.update, args.out, model=args.model, table=args.table, vectors_path=args.vectors,
                              kind=args.kind, progress=not args.no_progress, report=False,
                              recall_queries=args.recall_queries)
    else:
        params = build_index(args.out, kind=args.kind or "auto", model=args.model, table=args.table,
                             vectors_path=args.vectors, progress=not args.no_progress, report=False,
                             recall_queries=args.recall_queries)
    print(summary_line(params))


def cmd_neighbors(args) -> None:
    from .runners import calm_openmp

    calm_openmp()  # before faiss is imported
    from .model import neighbors

    if args.url:
        _url_neighbors(args)
        return
    keys = list(args.key or [])
    if args.keys_file:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        try:
            names = pq.read_schema(args.keys_file).names
        except (OSError, ValueError) as exc:
            raise UserError(f"{args.keys_file}: cannot read it as Parquet ({str(exc).splitlines()[0]})") from None
        if "key" not in names:
            raise UserError(f"{args.keys_file}: cannot read a 'key' column (it has: {', '.join(names)})")
        column = pq.read_table(args.keys_file, columns=["key"]).column("key")
        if column.null_count:  # (str(None) would look a user up as 'None')
            row = pc.index(pc.is_null(column), True).as_py()
            raise UserError(f"{args.keys_file}: row {row} has no 'key' ({column.null_count:,} row(s) are null there)")
        keys += [str(k) for k in column.to_pylist()]
    if not keys:
        raise UserError("give --key KEY (repeatable) or --keys-file FILE" + (
            f": the keys to look up in {args.vectors}" if args.vectors else ""))
    if args.out:
        outputs.check_file(args.out, "neighbors")  # before the search: nothing there, or an earlier result
        outputs.check_writable(args.out)
    with _warnings_as_lines():
        result = neighbors(args.model, keys, k=args.k, table=args.table or "docs", against=args.against,
                           index=args.index, vectors_file=args.vectors, exclude_seen=args.exclude_seen, as_flags=True)
    _print_neighbors(result, args.out)


def _url_neighbors(args) -> None:
    """neighbors --url: similar URLs for URLs the model knows or not (their vectors composed)."""
    from .model import neighbors

    given = next((flag for flag, on in (("--key", args.key), ("--keys-file", args.keys_file),
                                        ("--vectors", args.vectors)) if on), None)
    if given:
        raise UserError(f"give --url or {given}, not both")
    if args.table == "docs":
        raise UserError("--url asks for a URL's neighbours: give --table words_out (or words), or leave --table out")
    if args.out:
        outputs.check_file(args.out, "neighbors")
        outputs.check_writable(args.out)
    with _warnings_as_lines():
        result = neighbors(args.model, k=args.k, table=args.table or "words_out", against=args.against,
                           index=args.index, exclude_seen=args.exclude_seen, as_flags=True, urls=args.url)
    _print_neighbors(result, args.out)


def _print_neighbors(result, out: str | None) -> None:
    if out:
        outputs.write_parquet_file(result, out, "neighbors")
        print(f"wrote {result.num_rows} rows to {out}")
        return
    # tab-separated, a header first, in the table's own column order (that of Model.neighbors and --out)
    print("\t".join(result.column_names))
    for row in result.to_pylist():
        print("\t".join(f"{value:.4f}" if isinstance(value, float) else str(value) for value in row.values()))


def cmd_evaluate(args) -> None:
    from .evaluate import heldout_metrics, labels_metrics, pairs_metrics, save_and_print

    modes = [flag for flag, on in (("--heldout", args.heldout), ("--pairs", args.pairs), ("--labels", args.labels)) if on]
    if len(modes) != 1:
        raise UserError("give one of --heldout FILE, --pairs FILE or --labels FILE" + (
            f", not {' and '.join(modes)}: each is an evaluation of its own" if modes else ""))
    # a flag of another mode would be ignored: refused (--heldout took --test-fraction and --label-col in silence)
    for flag, given, used_by in (("--test-fraction", args.test_fraction is not None, ("--pairs", "--labels")),
                                 ("--key-col", args.key_col is not None, ("--labels",)),
                                 ("--label-col", args.label_col is not None, ("--labels",)),
                                 ("--k", args.k is not None, ("--heldout", "--labels")),
                                 ("--max-users", args.max_users is not None, ("--heldout",))):
        if given and modes[0] not in used_by:
            raise UserError(f"{flag} is for {' and '.join(used_by)}, not {modes[0]}: leave it out")
    if args.test_fraction is not None and not 0 < args.test_fraction < 1:
        raise UserError(f"--test-fraction must lie between 0 and 1, not {args.test_fraction:g}")
    k = 10 if args.k is None else args.k
    if args.heldout:
        max_users = 20_000 if args.max_users is None else args.max_users or None  # all (0): every one
        metrics = heldout_metrics(args.model, args.heldout, k=k, max_users=max_users)
        save_and_print(args.model, "heldout", metrics)
        if max_users is not None and metrics["users_with_pairs"] > max_users:
            print(f"sampled {metrics['users']:,} of the {metrics['users_with_pairs']:,} users with held-out pairs "
                  f"(seed 0); --max-users N evaluates N of them, --max-users all every one")
    elif args.pairs:
        save_and_print(args.model, "pairs", pairs_metrics(args.model, args.pairs, test_fraction=args.test_fraction))
    else:
        save_and_print(args.model, "labels", labels_metrics(args.model, args.labels, k=k, key_col=args.key_col or "key",
                                                            label_col=args.label_col or "label",
                                                            test_fraction=args.test_fraction or 0.2))


def cmd_report(args) -> None:
    from .report import peak_line, report

    print(peak_line(report(args.model, args.out, heldout=args.heldout, sample=args.sample, seed=args.seed,
                           max_users=args.max_users or None)))


def cmd_infer(args) -> None:
    from .infer import infer

    r = infer(args.model, args.inputs, args.out, format=args.format, doc_col=args.doc_col, token_col=args.token_col,
              time_col=args.time_col, time_unit=args.time_unit, delimiter=args.delimiter, epochs=args.epochs,
              alpha=args.alpha, min_alpha=args.min_alpha, seed=args.seed, batch_users=args.batch_users,
              progress=not args.no_progress, tmp_dir=args.tmp_dir, compose=not args.no_compose)
    without = f", and {r['null_vectors']:,} users without one (a null vector)" if r["null_vectors"] else ""
    print(f"inferred {r['rows']:,} user vectors (dim {r['dim']}) to {r['path']}{without} in {r['seconds']:.2f}s "
          f"({r['users_per_second']:,.0f} users/s)")


def cmd_forget(args) -> None:
    from .forget import check_retrain, forget, read_keys, report, retrain

    keys = read_keys(args.keys, args.key)
    retrain_out = check_retrain(args.model, args.corpus, args.retrain_epochs, args.retrain_out)
    result = forget(args.model, keys, corpus=args.corpus, exports=args.exports, index=args.index)
    if retrain_out is not None:
        retrain(result["model"], args.corpus, retrain_out, args.retrain_epochs,
                progress=not args.no_progress)
        result["retrained"] = {"model": retrain_out, "epochs": args.retrain_epochs}
    report(result)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="doc2vec-dist", description="Distributed doc2vec for users × URLs on Ray.",
                                formatter_class=_HelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name, func, help_text):
        sp = sub.add_parser(name, help=help_text, description=help_text, formatter_class=_HelpFormatter)
        sp.set_defaults(func=func)
        sp.add_argument("--no-progress", action="store_true", help="no progress bars")
        return sp

    g = add("generate", cmd_generate, "synthetic browsing logs with known communities")
    g.add_argument("--users", type=int, required=True, help="users (documents) to generate")
    g.add_argument("--urls", type=int, required=True, help="distinct URLs (the vocabulary)")
    g.add_argument("--out", required=True, help="new directory: events/ (Parquet) and truth/ (planted communities)")
    g.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives the same logs")
    g.add_argument("--communities", type=int, default=8, help="planted interest communities")
    g.add_argument("--events-per-user", type=float, default=30.0,
                   help="mean events of a user active the whole window (with --churn-per-week, in proportion to "
                        "the days a user is active: fewer on average)")
    g.add_argument("--hub-share", type=float, default=0.0,
                   help="share of users who also visit the one most popular URL: skewed data like a real catalogue, "
                        "where one output row meets most documents (e.g. 0.8 with --events-per-user 5)")
    g.add_argument("--days", type=float, default=30.0, help="days the events span")
    g.add_argument("--churn-per-week", type=float, default=0.0,
                   help="share of the active users who leave for good each week, new ones arriving to keep the "
                        "active population level (e.g. 0.1; what --expire-days is for: benchmarks/churn.py)")

    pr = add("prepare", cmd_prepare, "events, lists or text → corpus (vocabulary, ids, shard files)")
    pr.add_argument("inputs", nargs="+", help="files, directories or globs")
    pr.add_argument("--out", required=True, help="corpus directory to create")
    pr.add_argument("--config", help="YAML file with the same keys as the flags")
    add_config_flags(pr, PrepareConfig)
    fields = {f.name: f for f in dataclasses.fields(PrepareConfig)}
    pr.add_argument("--seed", type=int, default=None, help=_help(fields["seed"].metadata["help"], fields["seed"].default))
    pr.add_argument("--address", default=None, help=fields["address"].metadata["help"])
    pr.add_argument("--overwrite", action="store_true", help="replace an existing corpus")

    for name, func, text in (("train", cmd_train, "train on Ray: parameter servers + workers"),
                             ("baseline", cmd_baseline, "train gensim's Doc2Vec on the same corpus, same layout")):
        t = add(name, func, text)
        t.add_argument("--corpus", required=True, help="corpus directory made by prepare")
        t.add_argument("--out", required=True, help="model directory")
        engine_keys = "; the engine's own keys (num_ps, cache_rows, ...) are ignored" if name == "baseline" else ""
        t.add_argument("--config", help="YAML file with the same keys as the flags" + engine_keys)
        t.add_argument("--overwrite", action="store_true", help="replace an existing model")
        add_config_flags(t, TrainConfig, engine=name == "train")
        if name == "baseline":
            t.add_argument("--workers", type=int, default=None, help="gensim threads (default: all cores)")
            t.add_argument("--gensim-mode", default="iterable", choices=("iterable", "corpus_file"),
                           help="how gensim reads the corpus: iterable, its most accurate (the quality reference), "
                                "or corpus_file, its fastest")

    pl = add("plan", cmd_plan, "memory per parameter server, worker and node, and time per epoch, before training "
                               "(corpus statistics and a short calibration run on a slice of the corpus)")
    pl.add_argument("--corpus", help="corpus directory made by prepare (or an estimate: --users, --urls, "
                                     "--tokens-per-user)")
    pl.add_argument("--users", type=int, help="an estimate for this many users: with --corpus, that corpus scaled to "
                                              "them; without, with --urls and --tokens-per-user (docs/cluster.md)")
    pl.add_argument("--urls", type=int, help="an estimate without a corpus: the URLs (the vocabulary)")
    pl.add_argument("--tokens-per-user", type=float,
                    help="an estimate without a corpus: the mean events (tokens) of a user")
    pl.add_argument("--config", help="YAML file with the same keys as the flags")
    add_config_flags(pl, TrainConfig)
    pl.add_argument("--calibrate-seconds", type=float, default=30.0,
                    help="about how long the calibration run trains, in seconds")
    pl.add_argument("--no-calibrate", action="store_true", help="memory only, from modelled fixed costs; no time")
    pl.add_argument("--calibrate-workers", type=int, default=None,
                    help="workers the calibration trains (default: --num-workers); fewer, and their rate is scaled to "
                         "--num-workers by the scaling table: for a cluster larger than this machine")
    pl.add_argument("--workdir", help="where the calibration slice and model go, removed after (default: the "
                                      "system's temp dir; on a cluster, storage every node sees)")
    pl.add_argument("--json", help="also write the plan as JSON to this file")
    pl.add_argument("--network-gbps", type=float, default=10.0,
                    help="link bandwidth between nodes, Gbit/s, for the scaling table (each worker and each "
                         "parameter server on a node of its own)")
    pl.add_argument("--gpu-model", default=None, metavar="NAME",
                    help="GPU workers: the device of the scaling table, its memory, memory bandwidth and host link "
                         "from plan's table of known devices (H200, H100, A100, A100-40GB, L40S, L4, V100; "
                         "default H200: docs/cluster.md)")
    pl.add_argument("--device-tokens-per-second", type=float, default=None,
                    help="GPU workers: the tokens/s one GPU trains, for the scaling table (default: a calibration's "
                         "on the GPUs, else the kernel's measured on --gpu-model, else the H200's scaled by the "
                         "memories' bandwidth)")
    pl.add_argument("--hbm-gb-per-second", type=float, default=None,
                    help="GPU workers: one GPU's memory bandwidth, GB/s, for the device's ceiling (default: "
                         "--gpu-model's)")
    pl.add_argument("--pcie-gb-per-second", type=float, default=None,
                    help="GPU workers: one GPU's host-device link, GB/s a way, for the scaling table (default: "
                         "--gpu-model's)")

    tu = add("tune", cmd_tune, "search the training settings for this corpus on Ray Tune (ASHA stops poor trials "
                               "early); writes the trials' table, the best settings as YAML, a plot, and the best "
                               "against the defaults and gensim")
    tu.add_argument("--corpus", required=True, help="corpus directory made by prepare")
    tu.add_argument("--out", required=True, help="directory for the search's files")
    tu.add_argument("--heldout", help="held-out (key, token) Parquet from prepare --holdout: trials are measured on "
                                      "a validation split of the corpus, this file only in the final comparison")
    tu.add_argument("--labels", help="Parquet/CSV of key, label: trials are measured by k-NN label accuracy among "
                                     "the keys outside evaluate's test share, the comparison on the test share")
    tu.add_argument("--pairs", help="human similarity pairs: trials are measured by Pearson correlation on the pairs "
                                    "outside the test share, the comparison on the test share")
    tu.add_argument("--test-fraction", type=float, help="the share of --labels keys (default 0.2, evaluate's) or "
                                                        "--pairs pairs (default 0.5) kept from the search for the "
                                                        "comparison; evaluate --test-fraction scores the same share")
    tu.add_argument("--key-col", default="key", help="key column of --labels")
    tu.add_argument("--label-col", default="label", help="label column of --labels")
    tu.add_argument("--budget", type=float, default=8.0, help="the search's cost in full trainings")
    tu.add_argument("--space", help="YAML search space (default: optimizer and alpha, ns_exponent, negative, sample, "
                                    "dim, epochs; window and dbow_words for text)")
    tu.add_argument("--searcher", default="random", choices=("random", "optuna"),
                    help="how trials are drawn after the base settings and each optimizer at a known learning "
                         "rate: random (Ray Tune's) or optuna (Optuna's TPE, from what the trials so far found; "
                         "pip install optuna)")
    tu.add_argument("--calibrate-seconds", type=float, default=10.0,
                    help="how long plan's calibration run trains before the search, to estimate its time (0: none)")
    tu.add_argument("--no-compare", action="store_true", help="skip training the best, the defaults and gensim on "
                                                              "the whole corpus at the end")
    tu.add_argument("--config", help="YAML file with the base settings every trial starts from")
    # a trial trains as it is asked, afresh: no force_workers, and --resume / --resume-from refused in one line
    add_config_flags(tu, TrainConfig, engine=True, skip=("force_workers", "resume", "resume_from"))
    tu.add_argument("--resume", action="store_true", default=None, help=argparse.SUPPRESS)
    tu.add_argument("--resume-from", default=None, help=argparse.SUPPRESS)

    e = add("export", cmd_export, "write a table as Parquet (key, vector), word2vec text or npy")
    e.add_argument("--model", required=True, help="model directory")
    e.add_argument("--table", default="docs", choices=("docs", "words", "words_out"),
                   help="docs: user vectors; words_out: URL output vectors; words: URL input vectors")
    e.add_argument("--out", required=True, help="file to write, or a directory for one part per parameter server")
    e.add_argument("--format", default="parquet", choices=("parquet", "word2vec", "npy", "projector"),
                   help="Parquet (key, vector), word2vec text (gensim's KeyedVectors), a numpy matrix, or a directory "
                        "for TensorBoard's projector (tensors.tsv, metadata.tsv of key, host, count, "
                        "projector_config.pbtxt)")
    e.add_argument("--normalize", action="store_true", help="scale vectors to unit length")
    e.add_argument("--dtype", default="float32", choices=("float32", "float16"), help="vector element type")
    e.add_argument("--urls", metavar="LIST",
                   help="instead of the whole table, a vector for each URL of LIST (a Parquet or CSV file's url or "
                        "key column, else one URL a line), the model's or not: one it never saw composed from its "
                        "path, host or domain; writes Parquet key, vector, source (own, path, host, domain), part")
    e.add_argument("--sample", type=_at_least_one("--sample"), metavar="N",
                   help="--format projector: N users drawn at random (--seed), or the N most visited URLs, not every row")
    e.add_argument("--seed", type=int, default=None, help="--sample of users: the seed of the users drawn (default 0)")

    i = add("index", cmd_index, "build a faiss cosine index of a table or a (key, vector) Parquet, or update one "
                                "to a refreshed table (--update)")
    i.add_argument("--model", help="model directory (or --vectors)")
    i.add_argument("--table", default="docs", choices=("docs", "words", "words_out"), help="table of --model to index")
    i.add_argument("--vectors", help="Parquet with key, vector (instead of --model)")
    i.add_argument("--out", required=True, help="index directory to write")
    i.add_argument("--kind", default=None, choices=("flat", "hnsw", "ivfpq", "auto"),
                   help="auto: flat up to 1M rows, else ivfpq, re-ranked exactly (default: auto; with --update, the "
                        "old index's kind)")
    i.add_argument("--update", metavar="OLD_INDEX",
                   help="update this index to the new source instead of building anew: new keys added, changed "
                        "vectors replaced, keys gone removed, nothing trained again (--out may be OLD_INDEX)")
    i.add_argument("--recall-queries", type=_at_least_one("--recall-queries"), default=1000,
                   help="sampled rows whose recall@10 vs exact search is measured")

    n = add("neighbors", cmd_neighbors, "similar users for a user, likeliest URLs for a user (--against words_out), "
                                        "similar URLs for a URL (--table words_out; --url for any URL, the "
                                        "model's or not)")
    n.add_argument("--model", required=True, help="model directory")
    n.add_argument("--key", action="append", help="query key: a user id, or a URL with --table words_out "
                                                   "(repeatable)")
    n.add_argument("--url", action="append",
                   help="query URL, the model's or not (repeatable): one it never saw is asked by a vector composed "
                        "from its path, host or domain, and the answer's source column says which (own, path, host, "
                        "domain); --table defaults to words_out")
    n.add_argument("--keys-file", help="Parquet with a key column of queries")
    n.add_argument("--table", choices=("docs", "words", "words_out"),
                   help="table the keys are in (default: docs; words_out with --url)")
    n.add_argument("--against", choices=("docs", "words", "words_out"), help="table searched (default: --table)")
    n.add_argument("--k", type=_at_least_one("--k"), default=10, help="neighbours per key")
    n.add_argument("--index", help="search this saved index (from `index`) instead of an exact scan")
    n.add_argument("--vectors", metavar="PARQUET",
                   help="look the keys up in this key/vector Parquet (what `infer` or `export` wrote) instead of the "
                        "model: neighbours for users the model never saw")
    n.add_argument("--exclude-seen", action=argparse.BooleanOptionalAction, default=None,
                   help="with --against words_out, leave out the URLs each user visited (read from the model's "
                        "corpus, as evaluate does); still k URLs per user where the vocabulary has them (default: "
                        "on for user keys; where the corpus is gone, a warning and the URLs left in)")
    n.add_argument("--out", help="write key, neighbor, score, rank to this Parquet instead of printing")

    inf = add("infer", cmd_infer, "vectors for new users from their events, with the model's words_out frozen "
                                   "(gensim's infer_vector, batched); writes Parquet key, vector")
    inf.add_argument("--model", required=True, help="model directory")
    inf.add_argument("inputs", nargs="+", help="events of the new users: files, directories or globs, as for prepare")
    inf.add_argument("--out", required=True, help="Parquet file to write (key, vector)")
    prep = {f.name: f for f in dataclasses.fields(PrepareConfig)}
    for name in ("format", "doc_col", "token_col", "time_col", "time_unit", "delimiter"):
        f, flag, choices = prep[name], "--" + name.replace("_", "-"), prep[name].metadata.get("choices")
        inf.add_argument(flag, default=f.default, type=_one_of(flag, choices) if choices else None,  # one line
                         metavar="{" + ",".join(choices) + "}" if choices else None, help=f.metadata["help"])
    inf.add_argument("--epochs", type=int, help="passes over each user's events (default: the model's epochs)")
    inf.add_argument("--alpha", type=float, help="initial learning rate (default: the model's alpha)")
    inf.add_argument("--min-alpha", type=float, help="final learning rate (default: the model's min_alpha)")
    inf.add_argument("--seed", type=int, default=1, help="seed of start vectors and draws; same seed, same vectors")
    inf.add_argument("--batch-users", type=int, default=4096, help="users trained together; bounds memory")
    inf.add_argument("--tmp-dir", help="where the events are staged while read (default: the system's temp dir)")
    inf.add_argument("--no-compose", action="store_true",
                     help="drop the events of URLs the model never saw, as before, instead of giving each a row "
                          "composed from its path, host or domain")

    fo = add("forget", cmd_forget, "erase users from a model (a new version without them; older versions deleted), "
                                   "its corpus, held-out file, exports and index, and keep their salted hashes so no "
                                   "refresh brings them back (docs/forget.md)")
    fo.add_argument("--model", required=True, help="model directory (local)")
    fo.add_argument("--keys", help="file of the users' keys: one per line (UTF-8), or Parquet with a 'key' column")
    fo.add_argument("--key", action="append", help="a user's key (repeatable)")
    fo.add_argument("--corpus", help="corpus directory to erase them from too (the model's, so the next refresh joins "
                                     "through it), with the held-out file its corpus.json names")
    fo.add_argument("--exports", help="directory of exports to erase them from: Parquet, npy, word2vec, job.json, "
                                      "and any index inside (MODEL/exports always)")
    fo.add_argument("--index", help="faiss index directory to erase them from")
    fo.add_argument("--retrain-epochs", type=int, metavar="N",
                    help="then train N epochs from the new version on --corpus without them, into --retrain-out: "
                         "dilutes what they taught the URL rows (default: no retrain)")
    fo.add_argument("--retrain-out", metavar="DIR", help="the retrained model's directory, new or empty (default: MODEL-retrained)")

    ev = add("evaluate", cmd_evaluate, "held-out URL prediction or correlation with human similarity")
    ev.add_argument("--model", required=True, help="model directory")
    ev.add_argument("--heldout", help="Parquet of hidden (key, token) pairs from prepare --holdout")
    ev.add_argument("--pairs", help="human similarity: square matrix (Lee format) or key1, key2, score")
    ev.add_argument("--labels", help="Parquet/CSV of key, label: k-NN label accuracy on a fixed split")
    ev.add_argument("--key-col", help="key column of --labels (default: key)")
    ev.add_argument("--label-col", help="label column of --labels (default: label)")
    ev.add_argument("--test-fraction", type=float, help="--labels: the share of keys queried (default 0.2; the rest are "
                                                        "the references); --pairs: score only this share of the "
                                                        "pairs, as tune's comparison does (default: every pair)")
    ev.add_argument("--k", type=_at_least_one("--k"),
                    help="the k of recall@k (MRR is not cut: the best hidden URL at any rank), and neighbours of the "
                         "k-NN vote (default: 10)")
    ev.add_argument("--max-users", type=_count_or_all, metavar="N|all",
                    help="--heldout: evaluate a random sample of N of the users with held-out pairs (seed 0; the "
                         "output says how many of how many); all or 0: every one (default: 20000)")

    r = add("report", cmd_report, "one self-contained HTML page of a model: the run, training (loss, tokens/s, "
                                  "where the time went), quality (--heldout), a map of users and URLs, a refresh's drift")
    r.add_argument("--model", required=True, help="model directory")
    r.add_argument("--out", required=True, help="the page to write (an .html file; an earlier page is replaced)")
    r.add_argument("--heldout", help="Parquet of hidden (key, token) pairs from prepare --holdout: the quality section")
    r.add_argument("--sample", type=_at_least_one("--sample"), default=2000,
                   help="users, and most visited URLs, on the map")
    r.add_argument("--seed", type=int, default=0, help="seed of the samples (users on the map, users evaluated)")
    r.add_argument("--max-users", type=_count_or_all, default=5000, metavar="N|all",
                   help="--heldout: rank the URLs of a random N of the users with held-out pairs (drawn by --seed, as "
                        "evaluate draws them; the time grows with N x URLs), all or 0: every one")
    return p


def main(argv: list[str] | None = None) -> int:
    def work() -> None:
        args = _parse_args(argv)
        args.func(args)

    return command(work)  # the library's lines as the command's own; errors as one line and an exit status


if __name__ == "__main__":
    sys.exit(main())
