"""URL normalisation (urls.py): the rule case by case, and the rule through prepare, infer, neighbors and
the refresh, which read their inputs by the rule the corpus or model recorded (issue 47, item 5)."""

from __future__ import annotations

import json
import os
import pathlib
import random
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import load_benchmark

from doc2vec_dist import Model, pipeline
from doc2vec_dist.cli import main
from doc2vec_dist.corpus import Corpus
from doc2vec_dist.errors import UserError
from doc2vec_dist.synthetic import generate
from doc2vec_dist.urls import RAW, RULE_KEY, UrlRule, normalize, recorded

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_EVENTS = os.path.join(ROOT, "data", "sample", "events")
SAMPLE_URLS = pq.read_table(os.path.join(ROOT, "data", "sample", "truth", "urls.parquet")).column("url").to_pylist()

# (as read, by the default rule)
CASES = [
    ("HTTPS://Shop.Example/a", "https://shop.example/a"),                      # scheme and host lower-cased
    ("https://shop.example/A/b", "https://shop.example/A/b"),                  # the path's case is the site's
    ("https://shop.example/a/", "https://shop.example/a"),                     # one rule for the trailing slash
    ("https://shop.example/a//", "https://shop.example/a"),
    ("https://shop.example", "https://shop.example/"),                         # an empty path is "/"
    ("https://shop.example/", "https://shop.example/"),
    ("https://shop.example//", "https://shop.example/"),
    ("http://shop.example:80/a", "http://shop.example/a"),                     # default ports
    ("https://shop.example:443/a", "https://shop.example/a"),
    ("https://shop.example:0443/a", "https://shop.example/a"),
    ("https://shop.example:/a", "https://shop.example/a"),                     # an empty port
    ("http://shop.example:443/a", "http://shop.example:443/a"),                # not http's default
    ("https://shop.example:8443/a", "https://shop.example:8443/a"),
    ("https://shop.example/a#reviews", "https://shop.example/a"),              # an anchor in the page
    ("https://shop.example/a#", "https://shop.example/a"),
    ("https://app.example/#/settings/", "https://app.example/#/settings/"),    # a single-page app's routes
    ("https://app.example/#!/inbox", "https://app.example/#!/inbox"),
    ("https://shop.example/%7Euser/%61%2fb", "https://shop.example/~user/a%2Fb"),  # unreserved decoded, hex upper
    ("https://shop.example/a%2Db%5F%2E", "https://shop.example/a-b_."),
    ("https://shop.example/q?x=%e2%82%ac", "https://shop.example/q?x=%E2%82%AC"),
    ("https://shop.example/%25", "https://shop.example/%25"),                  # an escaped % stays escaped
    ("https://shop.example/a%zz", "https://shop.example/a%zz"),                # not an escape: as it is
    ("https://shop.example/a?utm_source=mail&id=7&utm_medium=e", "https://shop.example/a?id=7"),  # utm_* dropped
    ("https://shop.example/a?utm_source=mail", "https://shop.example/a"),
    ("https://shop.example/a?utm%5Fsource=mail", "https://shop.example/a"),    # its name escaped
    ("https://shop.example/a?UTM_SOURCE=x", "https://shop.example/a?UTM_SOURCE=x"),  # names match case-sensitively
    ("https://shop.example/a?", "https://shop.example/a"),                     # an empty query
    ("https://shop.example/a?b=2&a=1", "https://shop.example/a?b=2&a=1"),      # the query's order kept
    ("https://shop.example/a/?b=2#x", "https://shop.example/a?b=2"),
    ("https://www.shop.example/a", "https://www.shop.example/a"),              # www. kept by default
    ("https://user:Secret@Shop.Example/a", "https://user:Secret@shop.example/a"),  # userinfo as written
    ("https://[2001:DB8::1]:443/a/", "https://[2001:db8::1]/a"),              # IPv6 literal
    ("http://[::1]:8080", "http://[::1]:8080/"),
    ("https://[::1/a", "https://[::1/a"),                                      # not a host: as written
    ("https://shop.example:http/a", "https://shop.example:http/a"),
    ("https://Bücher.Example/Straße/", "https://bücher.example/Straße"),       # an IDN, Unicode or punycode
    ("https://xn--bcher-kva.example/a", "https://xn--bcher-kva.example/a"),
    ("item-4711", "item-4711"),                                                # no absolute http(s) URL: as read
    ("/a/b/", "/a/b/"),
    ("Shop.Example/a/", "Shop.Example/a/"),
    ("ftp://Files.Example/a/", "ftp://Files.Example/a/"),
    ("mailto:Someone@Shop.Example", "mailto:Someone@Shop.Example"),
    ("http:///a/", "http:///a/"),
    ("", ""),
]


@pytest.mark.parametrize("written, expected", CASES, ids=[c[0] or "empty" for c in CASES])
def test_the_default_rule_case_by_case(written, expected):
    rule = UrlRule()
    assert rule.normalize_url(written) == expected
    assert rule.normalize_url(expected) == expected  # idempotent: a normalised vocabulary meets its own rule
    assert normalize(pa.array([written, None]), rule).to_pylist() == [expected, None]


@pytest.mark.parametrize("rule, written, expected", [
    (UrlRule(drop_query=True), "https://shop.example/a?id=7&utm_source=x#top", "https://shop.example/a"),
    (UrlRule(drop_params=("fbclid", "ref*", "s?d")), "https://shop.example/a?fbclid=1&utm_source=x&ref_src=t&sid=2&k=v",
     "https://shop.example/a?utm_source=x&k=v"),
    (UrlRule(drop_params=()), "https://shop.example/a?utm_source=x", "https://shop.example/a?utm_source=x"),
    (UrlRule(merge_www=True), "https://WWW.Shop.Example/a/", "https://shop.example/a"),
    (UrlRule(merge_www=True), "https://user@www.shop.example/", "https://user@shop.example/"),
    (UrlRule(merge_www=True), "https://www.com/a", "https://www.com/a"),       # no dotted name would be left
    (RAW, "HTTPS://Shop.Example/a/?utm_source=x#top", "HTTPS://Shop.Example/a/?utm_source=x#top"),
])
def test_the_rules_options(rule, written, expected):
    assert rule.normalize_url(written) == expected
    assert normalize(pa.array([written]), rule).to_pylist() == [expected]


def _variants(url: str) -> list[str]:
    """Ways a log writes the page `url` (a normalised http(s) URL)."""
    scheme, rest = url.split("://", 1)
    host, slash, path = rest.partition("/")
    path = slash + path
    return [f"{scheme.upper()}://{host.upper()}{path}",                           # case
            url if path == "/" else url + "/",                                     # a trailing slash
            url + "#section-2",                                                    # an anchor
            url + ("&" if "?" in url else "?") + "utm_source=newsletter&utm_campaign=x",
            f"{scheme}://{host}:{443 if scheme == 'https' else 80}{path}",         # the default port
            f"{scheme}://{host}{path.replace('-', '%2D').replace('a', '%61')}"]    # unreserved escaped


def test_the_vectorised_rule_is_the_rule_value_by_value():
    """normalize's fast path (a vectorised check of what is normal already) never disagrees with
    normalize_url, on every case, the sample's URLs and their variants, for every option."""
    values = [c[0] for c in CASES] + [c[1] for c in CASES] + SAMPLE_URLS[:300]
    values += [v for url in SAMPLE_URLS[:300] for v in _variants(url)]
    values += ["https://a.example/x?a=1&utm_x=2", "https://a.example/x?utm_=1", "https://a.example/x&utm_a=1",
               "https://www.a.example/", "https://user@WWW.a.example/", "https://a.example/x?fbclid=1&ref=2"]
    for rule in (UrlRule(), UrlRule(drop_query=True), UrlRule(merge_www=True), UrlRule(drop_params=()),
                 UrlRule(drop_params=("fbclid", "ref*", "s?d"))):
        fast = normalize(pa.array(values), rule).to_pylist()
        assert fast == [rule.normalize_url(v) for v in values], rule
        assert normalize(pa.array(fast), rule).to_pylist() == fast, rule


def test_the_samples_urls_are_normal_already():
    """data/sample's URLs (https://www.nimbusdaisy.app/ …) are what the rule makes them: the README's
    sample output stays as it is."""
    assert normalize(pa.array(SAMPLE_URLS), UrlRule()).to_pylist() == SAMPLE_URLS


def test_the_rule_is_recorded_as_json_and_a_newer_rule_is_refused():
    for rule in (UrlRule(), UrlRule(drop_query=True, merge_www=True), UrlRule(drop_params=("a*", "b")), RAW):
        assert UrlRule.from_json(json.loads(json.dumps(rule.to_json()))) == rule
    assert UrlRule.from_json(None) == RAW  # made before the rule: as written
    assert UrlRule(normalize=False, drop_query=True) == RAW
    with pytest.raises(UserError, match="a URL rule of version 2, this program knows version 1"):
        UrlRule.from_json({**UrlRule().to_json(), "version": 2}, "vocab.arrow")
    assert UrlRule.of_settings(drop_params="fbclid, ref*") == UrlRule(drop_params=("fbclid", "ref*"))
    assert UrlRule.of_settings(drop_params="") == UrlRule(drop_params=())
    assert UrlRule.of_settings(no_normalize=True, drop_query=True) == RAW
    assert UrlRule.of_settings(**UrlRule(merge_www=True).settings()) == UrlRule(merge_www=True)


# -- through prepare --------------------------------------------------------------------------------------

PAGES = SAMPLE_URLS[:40]


def _messy_csv(path: str, users: list[str], seed: int = 0) -> list[str]:
    """Events of `users`, each visiting pages of PAGES written one of their ways; returns the pages visited."""
    rng = random.Random(seed)
    rows, visited = ["user_id,url"], set()
    for user in users:
        for page in rng.sample(PAGES, 12):
            rows.append(f"{user},{rng.choice(_variants(page) + [page])}")
            visited.add(page)
    with open(path, "w") as fh:
        fh.write("\n".join(rows) + "\n")
    return sorted(visited)


def _vocab(corpus: str) -> list[str]:
    return Corpus(corpus).vocab().column("token").to_pylist()


def test_a_messy_log_prepares_one_word_per_page(tmp_path, capsys):
    events = str(tmp_path / "messy.csv")
    pages = _messy_csv(events, [f"u{i}" for i in range(60)])
    assert main(["prepare", events, "--out", str(tmp_path / "c"), "--no-progress"]) == 0
    corpus = str(tmp_path / "c")
    assert sorted(_vocab(corpus)) == pages
    meta = Corpus(corpus).meta
    read = meta["distinct_tokens"]["read"]
    assert read > 3 * len(pages) and meta["distinct_tokens"]["normalised"] == len(pages)
    assert meta["url_rule"] == UrlRule().to_json() and recorded(os.path.join(corpus, "vocab.arrow")) == UrlRule()
    err = capsys.readouterr().err
    assert f"URLs normalised: {read:,} distinct tokens as read, {len(pages)} after the rule" in err


def test_no_normalize_keeps_the_tokens_as_written(tmp_path):
    events = str(tmp_path / "messy.csv")
    _messy_csv(events, [f"u{i}" for i in range(60)])
    assert main(["prepare", events, "--out", str(tmp_path / "c"), "--no-normalize", "--no-progress"]) == 0
    with open(events) as fh:
        written = {line.split(",", 1)[1] for line in fh.read().splitlines()[1:]}
    assert set(_vocab(str(tmp_path / "c"))) == written
    assert Corpus(str(tmp_path / "c")).meta["url_rule"]["normalize"] is False
    vocab_schema = pa.ipc.open_file(pa.memory_map(str(tmp_path / "c" / "vocab.arrow"))).schema
    assert RULE_KEY not in (vocab_schema.metadata or {})  # as written: no record, as before the rule


def test_lists_are_normalised_as_events_are(tmp_path):
    path = tmp_path / "lists.jsonl"
    path.write_text(json.dumps({"user_id": "u1", "url": ["HTTPS://Shop.Example/a/", "https://shop.example/a#x"]})
                    + "\n" + json.dumps({"user_id": "u2", "url": ["https://shop.example/a?utm_source=m"]}) + "\n")
    assert main(["prepare", str(path), "--format", "lists", "--out", str(tmp_path / "c"), "--no-progress"]) == 0
    assert _vocab(str(tmp_path / "c")) == ["https://shop.example/a"]


def test_a_text_corpus_is_the_same_with_and_without_the_rule(tmp_path):
    """Text is never normalised: Lee, mini_newsgroup and the PyPI summaries train on the same corpus."""
    text = tmp_path / "docs.txt"
    text.write_text("HTTPS://Shop.Example/a/ the Quick fox\nhttps://shop.example/a#x jumps\n")
    made = {}
    for name, extra in (("default", []), ("raw", ["--no-normalize"])):
        assert main(["prepare", str(text), "--format", "text", "--out", str(tmp_path / name), "--no-progress",
                     *extra]) == 0
        made[name] = {os.path.relpath(os.path.join(root, f), tmp_path / name): pathlib.Path(root, f).read_bytes()
                      for root, _, files in os.walk(tmp_path / name) for f in files if f.endswith(".arrow")}
    assert made["default"] == made["raw"]
    assert "HTTPS://Shop.Example/a/" in _vocab(str(tmp_path / "default"))


# -- a model reads its inputs by its rule: infer, neighbors ----------------------------------------------

def _training_urls(model: str, n: int = 6) -> list[str]:
    return Model.load(model).keys("words_out").to_pylist()[5:5 + n]


def _written_otherwise(url: str) -> str:
    scheme, rest = url.split("://", 1)
    host, _, path = rest.partition("/")
    return f"{scheme}://{host.upper()}/{path}" + ("/" if path else "")


def test_infer_gives_a_user_written_otherwise_the_same_vector(trained_model):
    model = Model.load(trained_model)
    urls = _training_urls(trained_model)
    canonical = model.infer({"newcomer": urls})
    otherwise = model.infer({"newcomer": [_written_otherwise(u) for u in urls]})
    assert np.any(otherwise != 0) and np.array_equal(otherwise, canonical)


def test_neighbors_and_vector_of_a_url_written_otherwise(trained_model, capsys):
    model = Model.load(trained_model)
    url = _training_urls(trained_model, 1)[0]
    asked = _written_otherwise(url)
    assert np.array_equal(model.vector(asked, "words_out"), model.vector(url, "words_out"))
    found = model.neighbors(asked, table="words_out", k=5)
    assert found.equals(model.neighbors(url, table="words_out", k=5))
    assert set(found.column("key").to_pylist()) == {url} and url not in found.column("neighbor").to_pylist()
    assert main(["neighbors", "--model", trained_model, "--key", asked, "--table", "words_out", "--k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t")[0] == "key" and len(lines) == 4
    assert all(line.startswith(url + "\t") for line in lines[1:])


def _as_written(made: str, into: str) -> str:
    """A copy of a model or corpus whose vocab.arrow records no rule: one made before URL normalisation."""
    copy = shutil.copytree(made, into)
    path = os.path.join(copy, "vocab.arrow")
    with pa.memory_map(path) as source:
        table = pa.ipc.open_file(source).read_all().replace_schema_metadata(None)
    with pa.OSFile(path + ".new", "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(path + ".new", path)
    assert recorded(path) == RAW
    return copy


def test_a_model_that_took_urls_as_written_reads_them_so_and_says_why_none_fits(trained_model, tmp_path):
    raw = Model.load(_as_written(trained_model, str(tmp_path / "raw")))
    urls = _training_urls(trained_model)
    assert np.any(raw.infer({"newcomer": urls}) != 0)
    with pytest.raises(UserError) as found:
        raw.infer({"newcomer": [_written_otherwise(u) for u in urls]})
    message = str(found.value)
    assert message.startswith("the events: none of the 6 events has a URL the model knows")
    assert "compared as written): 6 of them are its URLs once both are normalised, but the model took its URLs as " \
           "written (prepared with --no-normalize, or before URL normalisation)" in message
    with pytest.raises(UserError, match="unknown words_out key"):
        raw.vector(_written_otherwise(urls[0]), "words_out")


def test_events_of_another_site_are_told_apart_with_an_example_of_each_side(trained_model):
    with pytest.raises(UserError) as found:
        Model.load(trained_model).infer({"v1": ["https://elsewhere.example/1", "https://elsewhere.example/1"]})
    message = str(found.value)
    assert ("compared after the model's URL rule): 'https://elsewhere.example/1' against the model's 'https://"
            in message)
    assert "another site" not in message and message.endswith("does --token-col url hold their URLs?")


# -- the refresh reads today's events by the base's rule ---------------------------------------------------

def _sample_users(corpus: str, n: int = 40) -> list[str]:
    return Corpus(corpus).docs().column("key").to_pylist()[:n]


def test_a_refresh_of_a_normalised_base_normalises(sample_corpus, tmp_path):
    events = str(tmp_path / "today.csv")
    _messy_csv(events, _sample_users(sample_corpus[0]))
    out = str(tmp_path / "refreshed")
    assert main(["prepare", events, "--base", sample_corpus[0], "--out", out, "--no-progress"]) == 0
    refreshed = Corpus(out)
    assert refreshed.meta["refresh"]["new_words"] == 0 and _vocab(out) == _vocab(sample_corpus[0])
    assert refreshed.meta["url_rule"] == UrlRule().to_json()


def test_a_refresh_of_a_base_made_before_the_rule_takes_urls_as_written(sample_corpus, tmp_path):
    base = _as_written(sample_corpus[0], str(tmp_path / "old"))
    events = str(tmp_path / "today.csv")
    _messy_csv(events, _sample_users(sample_corpus[0]))
    out = str(tmp_path / "refreshed")
    assert main(["prepare", events, "--base", base, "--out", out, "--no-progress"]) == 0
    assert Corpus(out).meta["refresh"]["new_words"] > 0 and Corpus(out).meta["url_rule"] == RAW.to_json()


def test_the_refresh_job_refuses_a_rule_other_than_its_bases_before_any_work(trained_model, tmp_path, capsys):
    events = str(tmp_path / "today.csv")
    _messy_csv(events, _sample_users(Model.load(trained_model).dir.corpus_path()))
    day = tmp_path / "day"
    code = pipeline.refresh_job(["--events", events, "--base-model", trained_model, "--out", str(day),
                                     "--drop-query", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: --drop-query: the base {trained_model} was prepared with URLs normalised: ")
    assert not day.exists() or os.listdir(day) == []


def test_the_benchmarks_messy_log_normalises_back_to_its_pages(tmp_path):
    """benchmarks/messy_urls.py: every way it writes a page is that page again by the rule, so its
    normalised corpus is the clean log's."""
    bench = load_benchmark("messy_urls")
    generate(str(tmp_path / "gen"), 60, 40, seed=0, progress=False)
    found = bench.messy_log(str(tmp_path / "gen"), str(tmp_path / "messy.parquet"), messy=0.5)
    clean = pq.read_table(str(tmp_path / "gen" / "events")).column("url").combine_chunks()
    messy = pq.read_table(str(tmp_path / "messy.parquet")).column("url").combine_chunks()
    assert found["written_forms"] > found["pages"] and not messy.equals(clean)
    assert normalize(messy, UrlRule()).equals(clean)
    assert all(UrlRule().normalize_url(bench.written_otherwise(url, way)) == url
               for url in clean.unique().to_pylist() for way in bench.WAYS)


def test_evaluate_reads_held_out_urls_by_the_models_rule(trained_model, sample_corpus, tmp_path):
    """Held-out pairs written otherwise (another export of the same log) score as the model's own."""
    from doc2vec_dist.evaluate import heldout_metrics

    pairs = pq.read_table(sample_corpus[1])
    otherwise = pairs.set_column(1, "token", pa.array([_written_otherwise(u) for u in pairs.column("token").to_pylist()]))
    pq.write_table(otherwise, str(tmp_path / "otherwise.parquet"))
    expected = heldout_metrics(trained_model, sample_corpus[1], max_users=300, baseline=False)
    assert heldout_metrics(trained_model, str(tmp_path / "otherwise.parquet"), max_users=300, baseline=False) == expected
    assert expected["skipped_pairs"] == 0
