"""Synthetic browsing logs with planted communities, streamed to Parquet.

Changes when the synthetic data or its planted structure changes.

Users are doc2vec's documents and URLs its words. The generator plants a structure we know, so a trained
model can be checked against it (do users of one community end up close together, are held-out URLs
predicted better than "the most popular URLs"):

* URLs. Generating index j = 0..M-1 carries a Zipf weight w_j = 1/(j+1)^s. URLs are dealt to the C
  communities in blocks of C consecutive indices, one URL per community per block in a seeded random
  order, so every community has popular and rare URLs and the sizes differ by at most one. Each
  community owns its own web sites; a site's most popular page is its home page.
* Users. A user's mixture theta over communities is drawn from a sparse symmetric Dirichlet (on average
  80% of the mass on the top community, 95% on the top two); its argmax is the user's dominant community.
  The user's number of events is 1 + Poisson(lambda), lambda lognormal with mean events_per_user - 1,
  so activity has a heavy tail as real browsing does.
* Events. With probability general_fraction an event is a URL from the global Zipf over all URLs (the
  noise that keeps the task from being trivial); otherwise a community c ~ theta is drawn, then a URL
  from c's own Zipf: weight 1/(l+1)^s for the URL ranked l among c's URLs. Timestamps are distinct,
  uniform over a 30-day window (`days`).
* Churn (churn_per_week > 0, off by default): users come and go. Each week that share of the active
  users leaves for good (a constant daily hazard), and new users arrive at a steady rate that keeps the
  active population level: of `users` in all, users / (1 + q·days) are active on the first day (q the
  daily hazard), the rest arrive uniformly over the window. A user's events fall uniformly within its
  own active span, their number scaled by the span's share of the window (at least one); the truth
  records each user's first and last day (truth/users.parquet's active_from, active_until, ms).

Output (OUT/):
    events/part-NNNNN.parquet   user_id string, url string, ts timestamp[ms, UTC]; one file per
                                `users_per_file` users, a user's events all in one file, rows shuffled
    truth/users.parquet         user_id, community int32 (dominant), mix list<float32>, events int32;
                                one row group per events file, users in generation order
    truth/urls.parquet          url, community int32, rank int64, prob float64; sorted by rank
    generate.json               parameters, model constants, layout, summary; it marks OUT as a
                                generate output, so `prepare OUT` reads OUT/events (events_dir)

Memory is bounded by one chunk of users (about 60 bytes per event: 0.6 GB peak at the defaults) plus
the URL table (about 100 bytes per URL); nothing grows with the number of users. Every chunk draws from
its own generator seeded by (seed, chunk index), so the output is a function of the parameters
(users_per_file included, since it fixes the chunks) and chunks could be produced in parallel. User ids
depend only on the seed and the user's position, not on the chunking. Everything is written in a
staging directory next to OUT and renamed into place at the end: a failed run leaves nothing behind.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from . import outputs
from .errors import UserError

# --- model constants (recorded in generate.json) ------------------------------------------------------

# Sum of the Dirichlet parameters. Keeping the *sum* fixed (alpha = total / C per community) keeps the
# mixtures about equally sparse for any number of communities: ~0.8 of the mass on the top one. At 0.8
# (~0.7 on top) gensim's held-out recall@10 on the sample beat "most popular" by 18%; at 0.5 by 33%.
DIRICHLET_TOTAL = 0.5
# Standard deviation of log(activity). 1.0 gives a tail where the busiest of 20M users has a few
# thousand events while the median user has about 18 (for a mean of 30).
ACTIVITY_SIGMA = 1.0
WINDOW_START = "2024-03-01T00:00:00Z"
WINDOW_DAYS = 30
# Target pages per web site; the number of sites is capped by the distinct names we can form.
PAGES_PER_SITE = 10
# Rows per Parquet row group: bounds the strings materialised at once while writing.
ROW_GROUP_ROWS = 1_000_000

_WINDOW_START_MS = int(np.datetime64(WINDOW_START.rstrip("Z"), "ms").astype(np.int64))
_WINDOW_MS = WINDOW_DAYS * 24 * 3600 * 1000
_TS_TYPE = pa.timestamp("ms", tz="UTC")

# Independent random streams, one per purpose, all derived from the user's seed (see _rng).
_STREAM_URLS, _STREAM_USER_IDS, _STREAM_CHUNK, _STREAM_CHURN = 0, 1, 2, 3

MANIFEST = "generate.json"
EVENTS_LAYOUT = "events/part-NNNNN.parquet"

# Vocabulary for site names, paths and slugs. Two words make a site name: 256^2 distinct sites.
_WORDS = [
    "acorn", "acre", "alpine", "amber", "anchor", "apple", "arrow", "aspen", "atlas", "autumn", "badger",
    "bamboo", "banner", "barley", "basil", "bay", "beacon", "bear", "berry", "birch", "bison", "blaze", "bloom",
    "blue", "bolt", "boulder", "branch", "brave", "breeze", "brick", "bridge", "bright", "brook", "buffalo",
    "cactus", "camel", "candle", "canyon", "captain", "carbon", "cargo", "castle", "cedar", "chalk", "cherry",
    "cider", "citrus", "clay", "cliff", "cloud", "clover", "cobalt", "comet", "copper", "coral", "cotton", "cove",
    "crane", "creek", "crimson", "crown", "crystal", "cube", "daisy", "dawn", "delta", "desert", "dew", "dolphin",
    "dove", "dragon", "drift", "dune", "eagle", "echo", "ember", "emerald", "falcon", "fern", "fiber", "field",
    "finch", "fire", "fjord", "flame", "flint", "flora", "fog", "forest", "fossil", "fox", "frost", "galaxy",
    "garden", "garnet", "giant", "ginger", "glacier", "glen", "glow", "golden", "granite", "grape", "graph",
    "green", "grove", "gull", "harbor", "harvest", "hawk", "hazel", "heron", "hill", "hollow", "honey", "horizon",
    "husky", "indigo", "iris", "iron", "island", "ivory", "jade", "jasmine", "jungle", "juniper", "kale", "kelp",
    "kettle", "kite", "koala", "lagoon", "lake", "lantern", "larch", "lava", "lemon", "light", "lily", "lime",
    "linen", "lion", "loft", "lotus", "lunar", "lynx", "mango", "maple", "marble", "marsh", "meadow", "mesa",
    "metro", "mint", "mist", "moon", "moss", "mountain", "nectar", "nest", "nimbus", "noble", "north", "nova",
    "oak", "oasis", "ocean", "olive", "onyx", "opal", "orbit", "orchid", "otter", "owl", "panda", "paper",
    "peach", "pearl", "pebble", "pepper", "pine", "pixel", "planet", "plum", "polar", "pond", "poppy", "prairie",
    "prism", "pulse", "quartz", "quail", "quest", "rabbit", "rain", "raven", "reef", "ridge", "river", "robin",
    "rocket", "rose", "ruby", "rust", "saffron", "sage", "salmon", "sand", "sapphire", "savanna", "scout",
    "shadow", "shell", "sierra", "silver", "sky", "slate", "snow", "solar", "sparrow", "spice", "spring",
    "spruce", "star", "stone", "storm", "summit", "sun", "swan", "swift", "tango", "teal", "thistle", "thunder",
    "tiger", "timber", "topaz", "trail", "tulip", "tundra", "turtle", "valley", "velvet", "violet", "vista",
    "volcano", "walnut", "wave", "willow", "wind", "winter", "wolf", "wren", "zenith", "zephyr", "zinc",
]
_SECTIONS = [
    "news", "article", "story", "blog", "post", "watch", "video", "recipes", "products", "item", "p", "shop",
    "deals", "reviews", "docs", "wiki", "help", "forum/thread", "questions", "category", "tag", "sport", "travel",
    "music", "games", "events", "jobs", "listing", "gallery", "photos", "course", "learn", "guide", "tools",
    "compare", "offers", "local", "weather",
]
# Weighted the way the web is: mostly www and .com.
_SUBDOMAINS = (("www.", 0.70), ("", 0.15), ("m.", 0.05), ("blog.", 0.04), ("shop.", 0.03), ("news.", 0.03))
_TLDS = ((".com", 0.55), (".org", 0.08), (".net", 0.08), (".io", 0.05), (".co.uk", 0.05), (".de", 0.05),
         (".fr", 0.04), (".info", 0.03), (".co", 0.04), (".app", 0.03))


def generate(out: str, users: int, urls: int, *, seed: int = 0, communities: int = 8,
             events_per_user: float = 30.0, general_fraction: float = 0.3, zipf_s: float = 1.0,
             hub_share: float = 0.0, users_per_file: int = 200_000, days: float = WINDOW_DAYS,
             churn_per_week: float = 0.0, progress: bool = True) -> dict:
    """Write OUT/events/part-00000.parquet ... and the ground truth; return a summary dict
    (users, urls, events, files, communities, seconds).

    hub_share > 0 makes the data skewed the way real catalogues are: that share of users also visits
    the single most popular URL (one more event each), so one output row meets most documents.
    days: the window the events fall in. churn_per_week > 0: users leave and arrive (module docstring).
    """
    t0 = time.perf_counter()
    _check(users=users, urls=urls, seed=seed, communities=communities, events_per_user=events_per_user,
           general_fraction=general_fraction, zipf_s=zipf_s, hub_share=hub_share, users_per_file=users_per_file,
           days=days, churn_per_week=churn_per_week)
    # Plain Python numbers from here on (numpy scalars would not go into generate.json).
    users, urls, seed, communities, users_per_file = map(int, (users, urls, seed, communities, users_per_file))
    events_per_user, general_fraction, zipf_s, hub_share = map(float, (events_per_user, general_fraction, zipf_s,
                                                                       hub_share))
    days, churn_per_week = float(days), float(churn_per_week)
    churn = _Churn(users, days, churn_per_week) if churn_per_week > 0 else None
    out = os.path.abspath(out)
    if os.path.isfile(out) or (os.path.isdir(out) and os.listdir(out)):
        raise UserError(f"{out}: already exists and is not an empty directory; choose another --out")
    outputs.check_writable(out)
    made = outputs.make_dirs(os.path.dirname(out))
    # Staging directory beside OUT (same file system, so the final rename is atomic), under a name that
    # this process created: another's, even with the same process id on another machine, is never touched
    stage = None  # (a Ctrl-C as it is made: temp_path removed it)
    try:
        stage = outputs.temp_path(out, directory=True, what="partial")
        os.makedirs(os.path.join(stage, "events"))
        os.makedirs(os.path.join(stage, "truth"))
        table = _url_table(urls, communities, zipf_s, general_fraction, _rng(seed, _STREAM_URLS))
        id_key = int(_rng(seed, _STREAM_USER_IDS).integers(0, 2**48))

        n_files = math.ceil(users / users_per_file)
        events, drawn = 0, 0.0  # drawn: the users' expected events before the hub's (their activity's mean)
        with tqdm(total=users, unit="user", unit_scale=True, desc="generate", file=sys.stderr,
                  disable=not progress) as bar, \
                pq.ParquetWriter(os.path.join(stage, "truth", "users.parquet"), _CHURN_USERS_SCHEMA if churn else _USERS_SCHEMA,
                                 compression="zstd") as truth_users:
            for i in range(n_files):
                start = i * users_per_file
                n = min(users_per_file, users - start)
                spans = churn.spans(_rng(seed, _STREAM_CHURN, i), start, n) if churn else None
                chunk = _user_chunk(_rng(seed, _STREAM_CHUNK, i), n, table, communities, events_per_user,
                                    general_fraction, hub_share, days * 86_400_000, spans)
                ids = _user_ids(np.arange(start, start + n, dtype=np.uint64), id_key)
                _write_events(os.path.join(stage, "events", f"part-{i:05d}.parquet"), chunk, ids,
                              table.strings)
                truth_users.write_table(chunk.truth(ids, spans))
                events += len(chunk.user)
                drawn += n + (events_per_user - 1.0) * (float(np.sum((spans[1] - spans[0]) / (days * 86_400_000)))
                                                        if spans else n)
                del chunk, ids  # free the chunk before drawing the next one
                bar.update(n)

        # written once the users are drawn: with hub_share the hub's visits change every URL's share
        pq.write_table(table.truth(hub_share, drawn / users), os.path.join(stage, "truth", "urls.parquet"),
                       compression="zstd")
        summary = {"users": users, "urls": urls, "events": events, "files": n_files,
                   "communities": communities, "seconds": round(time.perf_counter() - t0, 3)}
        info = {
            "parameters": {"users": users, "urls": urls, "seed": seed, "communities": communities,
                           "events_per_user": events_per_user, "general_fraction": general_fraction,
                           "hub_share": hub_share,
                           # recorded when asked for, so the default data set's generate.json is as it was
                           **({"days": days} if days != WINDOW_DAYS else {}),
                           **({"churn_per_week": churn_per_week} if churn else {}),
                           "zipf_s": zipf_s, "users_per_file": users_per_file},
            "model": {"dirichlet_alpha": DIRICHLET_TOTAL / communities, "activity_sigma": ACTIVITY_SIGMA,
                      "window_start": WINDOW_START, "window_days": days,
                      "sites": table.sites},
            "layout": {"events": EVENTS_LAYOUT, "users": "truth/users.parquet",
                       "urls": "truth/urls.parquet"},
            "summary": summary,
        }
        with open(os.path.join(stage, MANIFEST), "w") as f:
            json.dump(info, f, indent=2)
            f.write("\n")
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked above); rename cannot replace it portably
        os.replace(stage, out)
    except BaseException:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        outputs.remove_dirs(made)
        raise
    return summary


def events_dir(directory: str) -> str | None:
    """The events directory of a generate output, None for any other directory.

    A generate output is recognised by its generate.json and found through the layout recorded there:
    its truth/ files and generate.json itself are no events, so `prepare OUT` reads OUT/events only.
    """
    try:
        with open(os.path.join(directory, MANIFEST)) as f:
            layout = json.load(f)["layout"]["events"]
        events = os.path.join(directory, os.path.dirname(layout))
    except (OSError, ValueError, KeyError, TypeError):  # no generate.json, or someone else's file of that name
        return None
    return events if os.path.isdir(events) and os.path.normpath(events) != os.path.normpath(directory) else None


def _check(**p) -> None:
    """Reject parameters that cannot give a sensible data set, naming the parameter."""
    def need(ok: bool, name: str, what: str) -> None:
        if not ok:  # by the command's flag where it has one (the library's keyword beside it)
            given = (f"{name}={p[name]!r}" if name in ("general_fraction", "zipf_s", "users_per_file") else
                     f"--{name.replace('_', '-')} {p[name]!r} ({name})")
            raise UserError(f"generate: {given}: {what}")

    for name, value in p.items():
        integral = name in ("users", "urls", "seed", "communities", "users_per_file")
        kinds = (int, np.integer) if integral else (int, float, np.integer, np.floating)
        need(isinstance(value, kinds) and not isinstance(value, bool), name,
             "must be an integer" if integral else "must be a number")
    need(p["users"] >= 1, "users", "must be at least 1")
    need(p["users"] < 2**48, "users", "must be below 2^48 (the user-id space)")
    need(p["urls"] >= 1, "urls", "must be at least 1")
    need(p["seed"] >= 0, "seed", "must be non-negative")
    need(1 <= p["communities"] <= p["urls"], "communities", "must be between 1 and the number of URLs")
    need(p["users_per_file"] >= 1, "users_per_file", "must be at least 1")
    need(math.isfinite(p["events_per_user"]) and p["events_per_user"] >= 1, "events_per_user",
         "must be at least 1 (every user has an event)")
    need(0.0 <= p["general_fraction"] <= 1.0, "general_fraction", "must be between 0 and 1")
    need(0.0 <= p["hub_share"] <= 1.0, "hub_share", "must be between 0 and 1")
    need(math.isfinite(p["zipf_s"]) and p["zipf_s"] >= 0, "zipf_s", "must be a non-negative number")
    need(math.isfinite(p["days"]) and p["days"] >= 1, "days", "must be at least 1")
    need(0.0 <= p["churn_per_week"] < 1.0, "churn_per_week", "must be at least 0 and below 1")


def _rng(seed: int, *stream: int) -> np.random.Generator:
    """A generator for one purpose (and one chunk): independent of the others, fixed by the seed."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=stream))


# --- URLs ---------------------------------------------------------------------------------------------

@dataclass
class _Urls:
    """The URL universe, indexed by generating index j (Zipf weight 1/(j+1)^s), plus samplers."""

    strings: pa.StringArray      # [M] the URL of index j
    community: np.ndarray        # [M] int32
    prob: np.ndarray             # [M] float64, expected share of all events
    global_cum: np.ndarray       # [M] inclusive cumulative weights in index order: global Zipf sampler
    by_community: np.ndarray     # [M] indices sorted by (community, j)
    community_cum: np.ndarray    # [M] inclusive cumulative in-community weights, by_community order
    community_lo: np.ndarray     # [C+1] where each community's run starts in by_community
    sites: int

    def sample_global(self, u: np.ndarray) -> np.ndarray:
        """URL indices for uniforms u in [0, 1), from the Zipf over all URLs."""
        pos = np.searchsorted(self.global_cum, u * self.global_cum[-1], side="right")
        return np.minimum(pos, len(self.global_cum) - 1)  # u*total may round up to total

    def sample_in(self, c: np.ndarray, u: np.ndarray) -> np.ndarray:
        """URL indices for communities c and uniforms u, from each community's own Zipf.

        All communities share one cumulative array (sorted by community), so a single searchsorted
        serves every event: community c owns the interval (cum[lo_c - 1], cum[hi_c - 1]].
        """
        lo, hi = self.community_lo[c], self.community_lo[c + 1]
        cum = self.community_cum
        base = np.where(lo > 0, cum[np.maximum(lo - 1, 0)], 0.0)
        pos = np.searchsorted(cum, base + u * (cum[hi - 1] - base), side="right")
        return self.by_community[np.clip(pos, lo, hi - 1)]

    def truth(self, hub_share: float = 0.0, drawn_per_user: float = 1.0) -> pa.Table:
        """truth/urls.parquet: one row per URL, sorted by expected popularity (rank 0 = most popular). With
        hub_share, a user draws drawn_per_user events (the mean) and, with that chance, one visit more to the
        hub (index 0): each URL's expected share of all events counts them."""
        prob = self.prob
        if hub_share > 0:
            prob = prob * drawn_per_user / (drawn_per_user + hub_share)
            prob[0] += hub_share / (drawn_per_user + hub_share)
        order = np.argsort(-prob, kind="stable")
        return pa.table({
            "url": self.strings.take(pa.array(order)),
            "community": pa.array(self.community[order], pa.int32()),
            "rank": pa.array(np.arange(len(order), dtype=np.int64)),
            "prob": pa.array(prob[order], pa.float64()),
        })


def _url_table(m: int, c: int, zipf_s: float, general_fraction: float, rng: np.random.Generator) -> _Urls:
    """Draw the M URLs, their communities and the samplers. O(M) memory and time, vectorised."""
    weight = 1.0 / np.power(np.arange(1, m + 1, dtype=np.float64), zipf_s)

    # Stratified assignment: each block of C consecutive indices holds one URL of every community, so
    # each community gets its share of popular and of rare URLs.
    blocks = -(-m // c)
    community = rng.permuted(np.tile(np.arange(c, dtype=np.int32), (blocks, 1)), axis=1).ravel()[:m]

    # Within a community a URL's weight follows its rank among the community's URLs: each community's
    # topical draws are Zipf(s) over its own URLs. (Restricting the global weights instead would give
    # the community holding URL 0 a head twice as heavy as the others' and make it the odd one out.)
    by_community = np.lexsort((np.arange(m), community))  # by community, then popularity
    community_lo = np.searchsorted(community[by_community], np.arange(c + 1)).astype(np.int64)
    local_rank = np.arange(m) - community_lo[community[by_community]]
    local_weight = np.empty(m)
    local_weight[by_community] = 1.0 / np.power(local_rank + 1.0, zipf_s)
    community_cum = np.cumsum(local_weight[by_community])
    community_weight = np.bincount(community, weights=local_weight, minlength=c)

    # Expected share of events: the general part plus, since E[theta_c] = 1/C for a symmetric
    # Dirichlet, an equal share of the topical part spread by each community's Zipf.
    prob = (general_fraction * weight / weight.sum()
            + (1.0 - general_fraction) / c * local_weight / community_weight[community])

    strings, sites = _url_strings(community, c, rng)
    return _Urls(strings=strings, community=community, prob=prob, global_cum=np.cumsum(weight),
                 by_community=by_community, community_cum=community_cum, community_lo=community_lo,
                 sites=sites)


def _url_strings(community: np.ndarray, c: int, rng: np.random.Generator) -> tuple[pa.StringArray, int]:
    """Realistic, unique URL strings: https://<sub><word><word><tld>/ or .../<section>/<w>-<w>-<k>.

    Sites are distinct word pairs, so site names are unique; k numbers a site's pages, so URLs are
    unique. Strings are assembled by Arrow kernels, never one by one in Python.
    """
    m = len(community)
    words = pa.array(_WORDS)
    n_words = len(_WORDS)
    sites = min(max(m // PAGES_PER_SITE, c), n_words * n_words)
    pair = rng.choice(n_words * n_words, size=sites, replace=False)
    site_names = pc.binary_join_element_wise(
        _weighted_pick(_SUBDOMAINS, sites, rng), words.take(pa.array(pair // n_words)),
        words.take(pa.array(pair % n_words)), _weighted_pick(_TLDS, sites, rng), "")

    # A site belongs to one community (site s to community s % C), so a site's pages share a topic;
    # with fewer possible sites than communities, sites are shared instead.
    if sites >= c:
        per = sites // c
        site = community.astype(np.int64) + c * rng.integers(0, per, size=m)
    else:
        site = rng.integers(0, sites, size=m)

    # Page number within its site, in order of popularity: page 0 (the site's most popular) is "/".
    order = np.lexsort((np.arange(m), site))
    sorted_site = site[order]
    first = np.r_[True, sorted_site[1:] != sorted_site[:-1]]
    run_start = np.flatnonzero(first)[np.cumsum(first) - 1]
    page = np.empty(m, dtype=np.int64)
    page[order] = np.arange(m) - run_start

    sections = pa.array(_SECTIONS).take(pa.array(rng.integers(0, len(_SECTIONS), size=m)))
    slug_a = words.take(pa.array(rng.integers(0, n_words, size=m)))
    slug_b = words.take(pa.array(rng.integers(0, n_words, size=m)))
    path = pc.binary_join_element_wise("/", sections, "/", slug_a, "-", slug_b, "-",
                                       pc.cast(pa.array(page), pa.string()), "")
    path = pc.if_else(pa.array(page == 0), "/", path)
    urls = pc.binary_join_element_wise("https://", site_names.take(pa.array(site)), path, "")
    return urls, len(np.unique(site))  # the sites some URL is on (20 sites over 8 communities use 16)


def _weighted_pick(choices: tuple, n: int, rng: np.random.Generator) -> pa.Array:
    values, p = zip(*choices, strict=True)
    p = np.asarray(p) / np.sum(p)
    return pa.array(values).take(pa.array(rng.choice(len(values), size=n, p=p)))


# --- users and events ---------------------------------------------------------------------------------

_USERS_SCHEMA = pa.schema([("user_id", pa.string()), ("community", pa.int32()),
                           ("mix", pa.list_(pa.float32())), ("events", pa.int32())])
_CHURN_USERS_SCHEMA = _USERS_SCHEMA.append(pa.field("active_from", pa.timestamp("ms", tz="UTC"))).append(
    pa.field("active_until", pa.timestamp("ms", tz="UTC")))


@dataclass(frozen=True)
class _Churn:
    """Users who come and go: a weekly share leaves (a constant daily hazard), arrivals keep the active
    population level. Users below `initial` (by global index) are active from the start; the others
    arrive uniformly over the window."""

    users: int
    days: float
    churn_per_week: float

    @property
    def hazard(self) -> float:
        """Leaving rate per day: exp(-7 · hazard) = 1 - churn_per_week."""
        return -math.log1p(-self.churn_per_week) / 7.0

    @property
    def initial(self) -> int:
        return min(self.users, round(self.users / (1.0 + self.hazard * self.days)))

    def spans(self, rng: np.random.Generator, first: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(from, until) of users first .. first + n - 1, ms from the window's start."""
        day = 86_400_000.0
        index = np.arange(first, first + n)
        start = np.where(index < self.initial, 0.0, rng.random(n) * self.days)
        until = np.minimum(start + rng.exponential(1.0 / self.hazard, n), self.days)
        return (start * day).astype(np.int64), np.maximum((until * day).astype(np.int64), (start * day).astype(
            np.int64) + 1)


@dataclass
class _Chunk:
    """One file's users and their events (rows already shuffled), as integer arrays."""

    mix: np.ndarray       # [n, C] float64
    counts: np.ndarray    # [n] events per user
    user: np.ndarray      # [E] int32, user within the chunk
    url: np.ndarray       # [E] int32, URL generating index
    ts: np.ndarray        # [E] int64, ms since the epoch (UTC)

    def truth(self, ids: pa.StringArray, spans: tuple[np.ndarray, np.ndarray] | None = None) -> pa.Table:
        n, c = self.mix.shape
        mix = pa.ListArray.from_arrays(pa.array(np.arange(0, n * c + 1, c, dtype=np.int32)),
                                       pa.array(self.mix.astype(np.float32).ravel()))
        columns = [ids, pa.array(self.mix.argmax(axis=1).astype(np.int32)), mix, pa.array(self.counts.astype(np.int32))]
        if spans is None:
            return pa.Table.from_arrays(columns, schema=_USERS_SCHEMA)
        return pa.Table.from_arrays(columns + [pa.array(_WINDOW_START_MS + spans[0]).view(_TS_TYPE),
                                               pa.array(_WINDOW_START_MS + spans[1]).view(_TS_TYPE)],
                                    schema=_CHURN_USERS_SCHEMA)


def _user_chunk(rng: np.random.Generator, n: int, urls: _Urls, c: int, events_per_user: float,
                general_fraction: float, hub_share: float = 0.0, window_ms: float = _WINDOW_MS,
                spans: tuple[np.ndarray, np.ndarray] | None = None) -> _Chunk:
    """Draw n users and all their events, vectorised over users and events. spans: each user's active
    (from, until), ms from the window's start (churn): its events fall there, as many as its share of
    the window holds."""
    mix = rng.dirichlet(np.full(c, DIRICHLET_TOTAL / c), size=n)

    # 1 + Poisson(lognormal): at least one event each, mean events_per_user, a long tail.
    activity = (events_per_user - 1.0) * rng.lognormal(-ACTIVITY_SIGMA**2 / 2, ACTIVITY_SIGMA, size=n)
    if spans is not None:
        activity = activity * (spans[1] - spans[0]) / window_ms
    counts = 1 + rng.poisson(activity)
    # the hub's visitors get one event more, at a random place among theirs, set to the most popular URL
    # below (drawn only when asked for, so the default data set is the same as without the option)
    hub = rng.random(n) < hub_share if hub_share > 0 else None
    if hub is not None:
        counts += hub
    total = int(counts.sum())
    user = np.repeat(np.arange(n, dtype=np.int32), counts)

    # Which events are general noise, and for the others which community they come from.
    general = rng.random(total) < general_fraction
    url = np.empty(total, dtype=np.int32)
    url[general] = urls.sample_global(rng.random(int(general.sum())))
    topical = ~general
    community = _pick_community(mix, user[topical], rng.random(int(topical.sum())))
    url[topical] = urls.sample_in(community, rng.random(len(community)))
    del general, topical, community
    if hub is not None:  # the event's time is drawn below independently of its URL: any place in the history
        at = (np.cumsum(counts) - counts)[hub] + (rng.random(int(hub.sum())) * counts[hub]).astype(np.int64)
        url[at] = urls.sample_global(np.zeros(1))[0]  # rank 1 of the global Zipf

    # Distinct times in the window: uniform draws sorted per user (one global sort: user u's keys
    # live in [u*W, (u+1)*W)), then + the event's position so equal milliseconds become distinct.
    # Draws stay below W - count, so the shifted times stay inside the window.
    start = np.cumsum(counts) - counts
    width = int(window_ms)
    lo, hi = (spans[0], spans[1]) if spans is not None else (np.zeros(n, np.int64), np.full(n, width, np.int64))
    span = np.maximum(hi - lo - counts, 1)[user]
    key = user.astype(np.int64) * width + (rng.random(total) * span).astype(np.int64)
    key.sort()
    ts = key - user.astype(np.int64) * width + lo[user]
    ts += np.arange(total, dtype=np.int64) - np.repeat(start, counts) + _WINDOW_START_MS
    del key, span

    # Interleave users within the file, so a reader cannot rely on rows being grouped.
    perm = rng.permutation(total)
    return _Chunk(mix=mix, counts=counts, user=user[perm], url=url[perm], ts=ts[perm])


def _pick_community(mix: np.ndarray, user: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Community c ~ mix[user] for each event, by one searchsorted over all users' CDFs.

    Row i's CDF is shifted by i, so the concatenated CDFs are one increasing array and event
    (user i, uniform u) looks up i + u. Zero-probability communities are empty intervals, never hit.
    """
    n, c = mix.shape
    cdf = np.cumsum(mix, axis=1)
    cdf[:, -1] = 1.0  # exact, so row i ends exactly where row i+1 starts
    cdf += np.arange(n, dtype=np.float64)[:, None]
    row = user.astype(np.int64)
    pos = np.searchsorted(cdf.ravel(), row + u, side="right")
    return np.minimum(pos - row * c, c - 1)  # i + u may round up to i + 1


def _user_ids(index: np.ndarray, key: int) -> pa.StringArray:
    """Opaque, unique ids 'u' + 12 hex digits for global user indices, built without Python strings.

    The index goes through a keyed bijection of the 48-bit integers (add, xorshift, odd multiply: each
    step invertible), so distinct users get distinct ids that look random, and any chunk can compute
    its own ids with no coordination.
    """
    mask = np.uint64(2**48 - 1)
    x = (index.astype(np.uint64) + np.uint64(key)) & mask
    for shift, mult in ((23, 0x9E3779B97F4B), (19, 0xC2B2AE3D27D5), (21, 0x85EBCA6B0F1D)):
        x ^= x >> np.uint64(shift)
        x = (x * np.uint64(mult | 1)) & mask  # uint64 wraps; the mask keeps it mod 2^48
    x ^= x >> np.uint64(24)

    hexdigits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    shifts = np.arange(44, -1, -4, dtype=np.uint64)
    chars = np.empty((len(x), 13), dtype=np.uint8)
    chars[:, 0] = ord("u")
    chars[:, 1:] = hexdigits[((x[:, None] >> shifts) & np.uint64(0xF)).astype(np.intp)]
    offsets = np.arange(0, 13 * (len(x) + 1), 13, dtype=np.int32)
    return pa.StringArray.from_buffers(len(x), pa.py_buffer(offsets), pa.py_buffer(chars.ravel()))


def _write_events(path: str, chunk: _Chunk, ids: pa.StringArray, url_strings: pa.StringArray) -> None:
    """One Parquet file, written a row group at a time so only one group's strings exist at once."""
    schema = pa.schema([("user_id", pa.string()), ("url", pa.string()), ("ts", _TS_TYPE)])
    # Dictionary-encode the strings even when a row group holds many distinct ones (Arrow's 1 MiB default
    # falls back to plain strings: files a third bigger and slower to read); the shuffled, all-distinct
    # timestamps gain nothing from a dictionary.
    with pq.ParquetWriter(path, schema, compression="zstd", use_dictionary=["user_id", "url"],
                          dictionary_pagesize_limit=64 << 20) as writer:
        for lo in range(0, len(chunk.user), ROW_GROUP_ROWS):
            rows = slice(lo, lo + ROW_GROUP_ROWS)
            writer.write_table(pa.Table.from_arrays([
                ids.take(pa.array(chunk.user[rows])),          # Arrow take: strings copied in C++
                url_strings.take(pa.array(chunk.url[rows])),
                pa.array(chunk.ts[rows]).view(_TS_TYPE),
            ], schema=schema))
