"""What prepare says once the corpus is made: the skips (skip_report), what to look at (attention_lines:
heavy documents) and what a refresh changed (refresh_report), each a line of its own.

Changes when a line of prepare's report changes; what is counted, and when, is prepare.py's and the passes'.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import prepare_base


def _compact(counts: dict) -> str:
    """'null_keys 3, empty_files 1': the non-zero counts, for a message."""
    return ", ".join(f"{k} {v:,}" for k, v in counts.items() if v)


def _name_files(files: list[str]) -> str:
    """The inputs in a message: all of them when few, the first three and a count when many."""
    return ", ".join(files) if len(files) <= 3 else f"{', '.join(files[:3])} and {len(files) - 3} more"


# A cumulative export given as a day's events: most of a file's events are ones the base has.
MOSTLY_OLD = 0.5
# Files mostly of the base's events named a line each; the rest are counted on one line (corpus.json names each).
NAMED_FILES = 3


def refresh_report(meta: dict) -> list[tuple[int, str]]:
    """What a refresh (prepare --base) changed, as (logging level, line): one line of counts, then a line
    of its own for each thing to look at (a base without times, each input file that is mostly its events,
    late events)."""
    r = meta["refresh"]
    lines: list[tuple[int, str]] = []

    def say(level: int, text: str) -> None:
        lines.append((level, text))

    join = r["mode"] == "join"
    how = "new events joined to each user's document" if join else f"documents of the last {meta['window_days']:g} day(s)"
    inputs = ""
    if r.get("input_users"):
        inputs = (f" (of the inputs' {r['input_users']:,} users, {r['known_input_users']:,} known: "
                  f"{r['known_input_users'] / r['input_users']:.1%})")
    say(logging.INFO, f"refresh of {r['base']} ({how}): users {r['base_docs']:,} known, {r['new_docs']:,} new, "
        f"{r['grown_docs']:,} with new events, {r['docs_without_new_events']:,} without"
        + (f" ({r['empty_base_docs']:,} now empty)" if r["empty_base_docs"] else "") + inputs
        + f"; URLs {r['base_vocab']:,} known, {r['new_words']:,} new, {r['words_without_new_events']:,} known "
        "ones without new events" + (f", {r['words_without_tokens']:,} without any token now"
                                     if r["words_without_tokens"] else "")
        + "; ids kept, new ones after (row r lives on server r % S, so new rows spread evenly)")
    early = r.get("events_not_after_base", 0)
    untimed = join and r.get("base_tokens_without_time", 0)
    if untimed:
        told = ("keeps no event times (prepared before corpora kept them, or without --time-col)"
                if not r.get("base_keeps_times") else f"has {untimed:,} token(s) whose time it was never told "
                "(from a refresh of a base that kept none)")
        say(logging.WARNING, f"{r['base']}: {told}: an input event it already has cannot be told from a new one, "
            "and is joined again; prepare the base anew with --time-col to keep them")
    for line in _mostly_old_files(r.get("files") or [], bool(untimed)):
        say(logging.WARNING, line)
    gone = r.get("forgotten_input_users") or r.get("forgotten_base_users")
    if gone:
        say(logging.INFO, f"forgotten users left out: {r.get('forgotten_input_users', 0):,} with "
            f"{r.get('forgotten_input_events', 0):,} event(s) in the inputs, {r.get('forgotten_base_users', 0):,} "
            "still in the base (the base's forget list)")
    if meta.get("expire_days") is not None:
        when = datetime.fromtimestamp(r["expire_cutoff"], timezone.utc).isoformat(timespec="seconds")
        say(logging.INFO, f"expired: {r.get('expired_users', 0):,} user(s) with no event in the last "
            f"{meta['expire_days']:g} day(s) (none since {when}; {r.get('expired_base_users', 0):,} of them "
            f"known to the base) and {r.get('expired_urls', 0):,} URL(s) no user left visits; "
            f"{meta['num_docs']:,} users and {meta['vocab_size']:,} URLs stay (ids closed up in order)"
            + (f"; {r['users_kept_without_time']:,} user(s) whose events carry no time stay, unjudged"
               if r.get("users_kept_without_time") else ""))
    if early and join:
        say(logging.INFO, f"{early:,} input event(s) of {r.get('users_with_events_not_after_base', 0):,} user(s) "
            "are at or before the base's latest time "
            + ("(late data, or the base's own: see above)" if untimed else "and not in it (late data)")
            + ": joined to their documents in time order, their users counted as changed")
    elif early:
        say(logging.INFO, f"{early:,} input event(s) at or before the base's latest time are taken to be the base's "
            "(a window does not read its documents): not counted as new")
    return lines


def _mostly_old_files(files: list[dict], untimed: bool) -> list[str]:
    """A line for each input file (of corpus.json's refresh.files) whose events are mostly ones the base
    has: a cumulative export given as a day's events among files of new ones. With a base without times
    (untimed), which cannot say which it has, a file mostly at or before its latest time is named instead,
    as one that may be such an export. NAMED_FILES are named in all, the rest counted on one line."""
    sent = [f for f in files if f["events"] and f["in_base"] > MOSTLY_OLD * f["events"]]
    early = [f for f in files if untimed and f not in sent and f["events"]
             and f["not_after_base"] > MOSTLY_OLD * f["events"]]
    lines = []
    named = _named(sent, NAMED_FILES)
    for f in named:
        lines.append(f"{f['file']} looks like a cumulative export: {_share(f['in_base'], f['events'], 'its')} were "
                     "in the base already (the same user, URL and time): dropped, so the documents hold each event "
                     f"once; {f['events'] - f['in_base']:,} are new")
    if sent[len(named):]:
        lines.append(_rest_line(sent[len(named):], "in_base", "look like cumulative exports",
                                "were in the base already: dropped as well"))
    room = max(0, NAMED_FILES - len(named))
    named = _named(early, room)
    for f in named:
        lines.append(f"{f['file']} may be a cumulative export: {_share(f['not_after_base'], f['events'], 'its')} "
                     "are at or before the base's latest time, and the base cannot say which it has: if so, the "
                     "documents now hold those events twice; give the events since the base alone")
    if early[len(named):]:
        lines.append(_rest_line(early[len(named):], "not_after_base", "may be cumulative exports",
                                "are at or before the base's latest time"))
    return lines


def _named(files: list[dict], room: int) -> list[dict]:
    """The files named a line each, `room` at most: all of them when a single one would be left to count."""
    return files if len(files) <= room + 1 else files[:room]


def _share(found: int, events: int, whose: str) -> str:
    return f"{found:,} of {whose} {events:,} events ({found / events:.0%})"


def _rest_line(files: list[dict], count: str, what: str, how: str) -> str:
    found, events = sum(f[count] for f in files), sum(f["events"] for f in files)
    return (f"{len(files):,} more input files {what}: {_share(found, events, 'their')} {how} (corpus.json's "
            "refresh.files names each)")


# A document holding more than this share of all tokens, in a corpus of at least HEAVY_MIN_DOCS documents,
# is named: with 1,000 documents the mean holds 0.1%, so one over 5% holds 50 times it, which browsing
# histories (activity roughly log-normal) give a person about once in a million; a bot, a crawler or a
# shared id ("0", "unknown") gives it every day, and weighs on every URL it visits.
HEAVY_SHARE = 0.05
HEAVY_MIN_DOCS = 1000
HEAVY_NAMED = 5


def _heavy_docs(tmp: str, num_tokens: int) -> list[dict]:
    """The documents of the corpus at `tmp` above HEAVY_SHARE of its tokens (HEAVY_MIN_DOCS or more
    documents), largest first: key, tokens and share of each, at most HEAVY_NAMED."""
    docs = prepare_base.read_mapped(os.path.join(tmp, "docs.arrow"))
    if docs.num_rows < HEAVY_MIN_DOCS or not num_tokens:
        return []
    lengths = docs.column("length").to_numpy()
    heavy = np.flatnonzero(lengths > HEAVY_SHARE * num_tokens)
    heavy = heavy[np.argsort(-lengths[heavy], kind="stable")][:HEAVY_NAMED]
    keys = docs.column("key").take(pa.array(heavy)).to_pylist()
    return [{"key": k, "tokens": int(lengths[i]), "share": round(float(lengths[i]) / num_tokens, 4)}
            for k, i in zip(keys, heavy)]


def unicode_twins(tmp: str) -> dict:
    """The user keys and tokens of the corpus at `tmp` that are one string in Unicode's NFC form but written
    apart ('Jos\\xe9' and 'Jose\\u0301'): prepare keeps them apart, as written, and says so. For each table
    that has any: how many strings have such a twin, in how many forms, and the first two, as ascii() shows them."""
    found = {}
    for what, name, column in (("docs", "docs.arrow", "key"), ("tokens", "vocab.arrow", "token")):
        twins = _nfc_twins(prepare_base.read_mapped(os.path.join(tmp, name)).column(column).combine_chunks())
        if twins:
            found[what] = twins
    return found


def _nfc_twins(values: pa.Array) -> dict | None:
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        return None
    wide = pc.invert(pc.string_is_ascii(values))
    if not pc.any(wide).as_py():
        return None
    odd = values.filter(wide)
    forms = pc.utf8_normalize(odd, form="NFC")
    plain = values.filter(pc.invert(wide))
    plain = plain.filter(pc.is_in(plain, value_set=forms))  # an ASCII string a wide one becomes ('K', U+212A)
    table = pa.table({"form": pa.concat_arrays([forms, plain]), "as_written": pa.concat_arrays([odd, plain])})
    counts = table.group_by("form").aggregate([("as_written", "count")])
    shared = counts.filter(pc.greater(counts["as_written_count"], 1))["form"]
    if not len(shared):
        return None
    twins = table.filter(pc.is_in(table["form"], value_set=shared))
    first = twins.filter(pc.equal(twins["form"], shared[0]))["as_written"].to_pylist()[:2]
    return {"count": twins.num_rows, "forms": len(shared), "first": [ascii(x) for x in first]}


def attention_lines(meta: dict) -> list[str]:
    """Warnings of what prepare kept but a user should look at, a line each, from a corpus.json: events
    with no time, keys or tokens written apart that are one in Unicode's NFC form, and documents that hold much
    of the corpus (HEAVY_SHARE)."""
    lines = []
    untimed, time = meta.get("events_without_time"), meta.get("time_col")
    if untimed:
        first = meta.get("events_without_time_where")
        where = f" (first: {', '.join(first)})" if first else ""
        lines.append(f"{untimed:,} event(s) with a null '{time}'{where}: " + (
            "outside any window, so left out (counted above)" if meta.get("window_days") else
            "kept, after their user's timed events (in input order); never a duplicate of another event, nor "
            "matched to one a base has"))
    doc = meta.get("doc_col") or "key"
    for what, twins in (meta.get("unicode_twins") or {}).items():
        name = f"'{doc}' key(s)" if what == "docs" else f"'{meta.get('token_col') or 'token'}' value(s)"
        lines.append(f"{twins['count']:,} {name} equal to another in Unicode's NFC form but written apart (first: "
                     f"{' and '.join(twins['first'])}; {twins['forms']:,} such form(s)): kept apart, as written, as "
                     f"different {'users' if what == 'docs' else 'URLs'}; write each in one form if they are one")
    for heavy in meta.get("heavy_docs") or []:
        lines.append(f"document {heavy['key']!r} ('{doc}') holds {heavy['share']:.1%} of all tokens "
                     f"({heavy['tokens']:,} of {meta['num_tokens']:,}), over {HEAVY_SHARE:.0%}: a bot, a crawler "
                     "or a shared id more often than a person; --max-tokens-per-doc N keeps each document's latest "
                     "N events")
    return lines


def skip_report(meta: dict) -> list[str]:
    """One line per reason prepare dropped something, with the count and where the first ones were,
    then the keys and tokens it stripped of whitespace, how it read each file's times, and what it kept
    that is worth knowing (documents of a single token), from a corpus.json."""
    doc, tok, time = meta.get("doc_col"), meta.get("token_col"), meta.get("time_col")
    fmt = meta.get("format", "events")
    token = "event" if fmt == "events" else "token"
    what = {
        "empty_files": "empty input file(s)",
        "null_keys": f"row(s) with a null '{doc}'",
        "empty_keys": f"row(s) with an empty '{doc}'",
        "invalid_utf8_lines": "line(s) that are not valid UTF-8 (their keys are not reused)",
        "null_tokens": f"{token}(s) with a null '{tok}'" if fmt == "events" else "null token(s)",
        "empty_tokens": f"{token}(s) with an empty '{tok}'" if fmt == "events" else "empty token(s)",
        "events_outside_window": f"event(s) before the window of the last {meta.get('window_days')} day(s) "
                                 "(or without a time)",
        "duplicate_events": f"duplicate event(s): the same '{doc}', '{tok}' and '{time}' as an earlier one",
        "events_in_base": f"event(s) the base has already: the same '{doc}', '{tok}' and '{time}' as one of its own",
        "events_of_forgotten_users": "event(s) of users on the base's forget list (doc2vec-dist forget)",
        "tokens_beyond_max_per_doc": f"{token}(s) beyond max_tokens_per_doc={meta.get('max_tokens_per_doc')}: the "
                                     f"earliest of {meta.get('docs_capped', 0):,} document(s) longer than that",
        "unread_files": "file(s) in the input folders that are not data (hidden, or not .parquet, .csv, .jsonl …)",
        "tokens_below_min_count": f"{token}(s) of a token seen fewer than min_count={meta.get('min_count')} "
                                  "times",
        "tokens_beyond_max_vocab": f"{token}(s) of a token beyond the max_vocab={meta.get('max_vocab')} "
                                   "most frequent",
        "docs_without_tokens": "document(s) left with no token (each null, empty or out of the vocabulary)",
    }
    lines = []
    where = meta.get("skipped_where", {})
    for reason, count in meta.get("skipped", {}).items():
        if count:
            first = where.get(reason)
            lines.append(f"skipped {count:,} {what.get(reason, reason)}"
                         + (f" (first: {', '.join(first)})" if first else ""))
    for column, count in (meta.get("stripped_whitespace") or {}).items():
        first = (meta.get("stripped_where") or {}).get(column)
        lines.append(f"stripped leading or trailing whitespace from {count:,} '{column}' value(s), so that they "
                     "match the same values without it" + (f" (first: {', '.join(first)})" if first else ""))
    for what, files in (meta.get("time_read") or {}).items():
        lines.append(f"{_name_files(files)}: '{time}' read as {what}")
    if meta.get("docs_with_one_token"):
        lines.append(f"kept {meta['docs_with_one_token']:,} document(s) with a single {token}: they train "
                     "like any other")
    if meta.get("words_without_events"):
        words = f"'{tok}' values" if fmt == "events" and tok else "words"
        lines.append(f"kept {meta['words_without_events']:,} of the {meta['vocab_size']:,} {words} in the vocabulary "
                     "with no event left to train on (all held out, or cut by --max-tokens-per-doc): each keeps its "
                     "row, which training never moves (neighbors and index leave such all-zero rows out)")
    if meta.get("docs_without_heldout"):
        lines.append(f"held out nothing of {meta['docs_without_heldout']:,} document(s) with one distinct "
                     "token: it stays for training, so they are not in the held-out file")
    return lines
