"""URL normalisation: the one rule by which the ways a log writes one page become one token.

Changes when the rule changes (then RULE_VERSION goes up, so that a model keeps the rule it was made
with). Browsing logs write one page many ways: `HTTPS://Shop.Example/a/`, `https://shop.example/a`,
`https://shop.example:443/a#reviews`, `https://shop.example/a?utm_source=mail`. Taken as written, each
is a word of its own, trained apart on a share of the page's visits, and a user's likeliest URLs list
one page three times. The rule (UrlRule, on by default for the token column of `--format events` and
`lists`, never for text) changes only absolute http(s) URLs, `scheme://host…`; any other token (an
item id, a path without a host) is kept as read:

    scheme, host   lower-cased (an IDN's Unicode letters too; userinfo and an IPv6 literal's form kept)
    port           dropped where it is the scheme's default (:80 on http, :443 on https), or empty
    %-escapes      of unreserved characters (A-Z a-z 0-9 - . _ ~) decoded, the hex of the others
                   upper-cased: %7E is ~, %2f is %2F (RFC 3986, 6.2.2)
    path           an empty one is "/"; trailing slashes of any other are dropped: /a/ is /a. Sites
                   answer both at one page (one redirects to the other), so logs hold both; the rare
                   site serving two pages there loses nothing a browsing model can use
    query          kept, in its order, less the parameters drop_params names (`*` and `?` globs, matched
                   case-sensitively on the name; default utm_*, campaign tags that never change the
                   page); all of it dropped with drop_query; an empty one ("?") dropped
    fragment       dropped (an anchor within the page: #reviews), except a route of a single-page
                   app, "#/…" or "#!…", which names a page of its own and is kept
    www.           kept by default: www.a.com and a.com are two hosts that may serve two sites, and
                   merging them is a guess the log cannot check; merge_www drops a leading "www."
                   where a dotted name is left (www.a.com is a.com; www.com stays)

The rule is idempotent (normalising a normalised URL changes nothing), so a vocabulary normalised once
meets later inputs normalised by the same rule. `prepare` records the rule it applied in corpus.json
("url_rule") and in vocab.arrow's schema metadata (RULE_KEY); a model copies its corpus's vocab.arrow,
so it carries the rule, and infer, neighbors on a URL table and the refresh (`prepare --base`) read their
inputs by it. A vocabulary without the record (made before the rule, or with --no-normalize) took
URLs as written (RAW).

Speed: `normalize` works on an Arrow array's distinct values (dictionary_encode, then take), and of
those sends to Python only what a vectorised check cannot show to be normal already, so a clean log
costs a few regular-expression passes in Arrow.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from .errors import UserError

RULE_VERSION = 1
DEFAULT_DROP_PARAMS = ("utm_*",)
RULE_KEY = b"doc2vec_dist.url_rule"  # vocab.arrow's schema metadata: the rule, as JSON

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_DEFAULT_PORT = {"http": "80", "https": "443"}
# scheme :// authority path ?query #fragment (RFC 3986, appendix B, for an absolute URL)
_PARTS = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://([^/?#]*)([^?#]*)(?:\?([^#]*))?(?:#(.*))?", re.DOTALL)
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_DIGITS = re.compile(r"[0-9]*")
# the tokens the rule may change: an http(s) scheme, in any case, and a host (RE2, Arrow's engine)
_HTTP = r"(?i)^https?://[^/?#]"


@dataclass(frozen=True)
class UrlRule:
    """How the token column's URLs are normalised (the module docstring says what each part does)."""

    normalize: bool = True
    drop_query: bool = False
    drop_params: tuple[str, ...] = DEFAULT_DROP_PARAMS
    merge_www: bool = False
    version: int = RULE_VERSION

    def __post_init__(self) -> None:
        if not self.normalize:  # as written: nothing else applies, so every such rule is RAW
            object.__setattr__(self, "drop_query", False)
            object.__setattr__(self, "merge_www", False)
        object.__setattr__(self, "drop_params", tuple(p for p in self.drop_params if p) if self.normalize else ())
        names = "|".join(_glob_regex(g) for g in self.drop_params)
        object.__setattr__(self, "_dropped", re.compile(f"(?:{names})") if names else None)

    # -- as recorded -----------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"normalize": self.normalize, "drop_query": self.drop_query, "drop_params": list(self.drop_params),
                "merge_www": self.merge_www, "version": self.version}

    @classmethod
    def from_json(cls, data: dict | None, where: str = "") -> UrlRule:
        """A recorded rule; None (no record: a corpus or model from before the rule) is RAW."""
        if data is None:
            return RAW
        if not isinstance(data, dict) or data.get("version") != RULE_VERSION:
            found = data.get("version") if isinstance(data, dict) else data
            raise UserError(f"{where or 'url_rule'}: a URL rule of version {found!r}, this program knows version "
                            f"{RULE_VERSION}; use the doc2vec-dist that made it")
        return cls(bool(data.get("normalize", True)), bool(data.get("drop_query", False)),
                   tuple(str(p) for p in data.get("drop_params", DEFAULT_DROP_PARAMS)),
                   bool(data.get("merge_www", False)))

    def schema_metadata(self) -> dict[bytes, bytes]:
        """vocab.arrow's metadata recording the rule (nothing for RAW: no record means as written)."""
        return {RULE_KEY: json.dumps(self.to_json()).encode()} if self.normalize else {}

    @classmethod
    def of_schema(cls, schema: pa.Schema, where: str = "") -> UrlRule:
        raw = (schema.metadata or {}).get(RULE_KEY)
        if raw is None:
            return RAW
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise UserError(f"{where}: its URL rule ({RULE_KEY.decode()}) is not JSON; the file is damaged") from None
        return cls.from_json(data, where)

    @classmethod
    def of_settings(cls, no_normalize: bool = False, drop_query: bool = False, drop_params: str | None = None,
                    merge_www: bool = False) -> UrlRule:
        """The rule prepare's settings ask for (--no-normalize, --drop-query, --drop-params, --merge-www)."""
        if no_normalize:
            return RAW
        params = DEFAULT_DROP_PARAMS if drop_params is None else tuple(p.strip() for p in drop_params.split(","))
        return cls(True, drop_query, params, merge_www)

    def settings(self) -> dict:
        """The prepare settings that ask for this rule (of_settings's inverse)."""
        return {"no_normalize": not self.normalize, "drop_query": self.drop_query,
                "drop_params": ",".join(self.drop_params), "merge_www": self.merge_www}

    def flags(self) -> str:
        """How this rule differs from the default, as prepare's flags (" with --drop-query"), or ""."""
        given = (["--drop-query"] if self.drop_query else []) + (["--merge-www"] if self.merge_www else [])
        if self.drop_params != DEFAULT_DROP_PARAMS:
            given.append(f"--drop-params {','.join(self.drop_params) or repr('')}")
        return f" with {' '.join(given)}" if given else ""

    def describe(self) -> str:
        """The rule in a few words, for a report line or a message."""
        if not self.normalize:
            return "URLs taken as written (--no-normalize, or before URL normalisation)"
        query = ("query dropped" if self.drop_query else
                 f"query kept less {', '.join(self.drop_params)}" if self.drop_params else "query kept")
        return ("URLs normalised: scheme and host lower-cased, default port, fragment and trailing slash dropped, "
                f"unreserved %-escapes decoded, {query}" + (", www. merged" if self.merge_www else ""))

    # -- applied ---------------------------------------------------------------------------------------

    def normalize_url(self, url: str) -> str:
        """One token by the rule: an absolute http(s) URL normalised, anything else as it is."""
        if not self.normalize:
            return url
        m = _PARTS.fullmatch(url)
        if m is None or m[1].lower() not in _DEFAULT_PORT or not m[2]:
            return url
        scheme = m[1].lower()
        userinfo, at, hostport = m[2].rpartition("@")
        found = _host_port(hostport)
        if found is None:  # not a host we can read (an unclosed IPv6 literal, a port of letters): as written
            return url
        host, port = found
        host = _host(host)
        if self.merge_www and host.startswith("www.") and "." in host[4:].strip("."):
            host = host[4:]
        if port is not None and (port == "" or port.lstrip("0") == _DEFAULT_PORT[scheme]):
            port = None
        path = _escapes(m[3]).rstrip("/") or "/"
        query = None if self.drop_query or m[4] is None else self._query(_escapes(m[4]))
        fragment = m[5]
        keep_fragment = fragment is not None and fragment.startswith(("/", "!"))
        return (f"{scheme}://{userinfo}{at}{host}" + (f":{port}" if port is not None else "") + path
                + (f"?{query}" if query else "") + (f"#{_escapes(fragment)}" if keep_fragment else ""))

    def _query(self, query: str) -> str:
        if self._dropped is None:
            return query
        return "&".join(p for p in query.split("&") if not self._dropped.fullmatch(p.partition("=")[0]))

    def _maybe_changed(self, values: pa.Array) -> pa.Array:
        """bool mask of the values this rule may change: the http(s) URLs that a vectorised check does
        not show to be normal already. Conservative: a value it leaves out is one normalize_url keeps."""
        query = "" if self.drop_query else r"(\?[^#%]+)?"
        # lower-case scheme and host of plain letters, no userinfo, port or escape, a path that is "/" or
        # ends in another character, no fragment
        plain = pc.match_substring_regex(values, r"^https?://[a-z0-9.\-]+(/|/[^?#%]*[^/?#%])" + query + "$")
        suspect = pc.invert(plain)
        if self.drop_params and not self.drop_query:
            queried = pc.and_(plain, pc.match_substring(values, "?"))  # what else might hold a dropped parameter
            if pc.any(queried).as_py():
                names = "|".join(_glob_regex(g) for g in self.drop_params)
                dropped = pc.match_substring_regex(values, rf"[?&]({names})(=|&|#|$)")
                suspect = pc.or_(suspect, pc.and_(queried, dropped))
        if self.merge_www:
            suspect = pc.or_(suspect, pc.match_substring_regex(values, r"(?i)^https?://([^/?#]*@)?www\."))
        return pc.and_(suspect, pc.match_substring_regex(values, _HTTP)).fill_null(False)


RAW = UrlRule(normalize=False, drop_params=())


def normalize(tokens: pa.Array, rule: UrlRule | None) -> pa.Array:
    """A string array's tokens by `rule` (None or RAW: as they are), nulls kept. Each distinct value is
    normalised once (dictionary_encode, then take), and only where it may change (UrlRule._maybe_changed)."""
    if rule is None or not rule.normalize or len(tokens) == 0:
        return tokens
    encoded = pc.dictionary_encode(tokens)
    fixed = normalize_distinct(encoded.dictionary, rule)
    if fixed is encoded.dictionary:
        return tokens
    return fixed.take(encoded.indices)


def normalize_distinct(values: pa.Array, rule: UrlRule) -> pa.Array:
    """Distinct (or any) string values by `rule`, position by position; `values` itself when none changes."""
    if not rule.normalize or len(values) == 0:
        return values
    suspect = rule._maybe_changed(values)
    if not pc.any(suspect).as_py():
        return values
    changed = [rule.normalize_url(v) for v in values.filter(suspect).to_pylist()]
    return pc.replace_with_mask(values, suspect, pa.array(changed, values.type))


def http_urls(values: pa.Array) -> int:
    """How many of `values` are absolute http(s) URLs (what the rule may change; the rest it keeps)."""
    if len(values) == 0:
        return 0
    return pc.sum(pc.match_substring_regex(values, _HTTP)).as_py() or 0


def report_line(read: int, normalised: int, urls: int, rule: UrlRule) -> str:
    """prepare's line on the token column: its distinct tokens as read and once normalised."""
    if not rule.normalize:
        return f"URLs taken as written (--no-normalize, or a --base prepared so): {read:,} distinct tokens"
    kept = read - urls
    return (f"URLs normalised{rule.flags()}: {read:,} distinct tokens as read, {normalised:,} after the rule "
            "(--no-normalize keeps them as written; docs/commands.md)"
            + (f"; {kept:,} of them not absolute http(s) URLs, kept as read" if kept else ""))


def recorded(path: str) -> UrlRule:
    """The rule recorded in a vocab.arrow (RAW where none is: made before the rule, or as written)."""
    try:
        with pa.memory_map(path) as source:
            schema = pa.ipc.open_file(source).schema
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path}: cannot read: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return UrlRule.of_schema(schema, path)


def _host_port(hostport: str) -> tuple[str, str | None] | None:
    """(host, port or None) of an authority less its userinfo; None when the port is not digits or an
    IPv6 literal is not closed."""
    if hostport.startswith("["):
        close = hostport.find("]")
        if close < 0:
            return None
        host, rest = hostport[:close + 1], hostport[close + 1:]
        if not rest:
            return host, None
        if not rest.startswith(":") or not _DIGITS.fullmatch(rest[1:]):
            return None
        return host, rest[1:]
    host, colon, port = hostport.rpartition(":")
    if not colon:
        return hostport, None
    if not _DIGITS.fullmatch(port) or not host:
        return None
    return host, port


def _host(host: str) -> str:
    """A host lower-cased, its escapes (rare: an encoded IDN) normalised with upper-case hex."""
    if "%" not in host:
        return host.lower()
    return "".join(part if part.startswith("%") else part.lower()
                   for part in re.split(r"(%[0-9A-F]{2})", _escapes(host)))


def _escapes(text: str) -> str:
    """%-escapes of unreserved characters decoded, the others' hex upper-cased."""
    if "%" not in text:
        return text

    def one(m: re.Match) -> str:
        char = chr(int(m[1], 16))
        return char if char in _UNRESERVED else "%" + m[1].upper()

    return _ESCAPE.sub(one, text)


def _glob_regex(glob: str) -> str:
    """A parameter-name glob (`*` any run of characters, `?` one) as a pattern that Python's re and
    Arrow's RE2 read alike, so that the vectorised check and normalize_url agree."""
    return "".join("[^&=#]*" if c == "*" else "[^&=#]" if c == "?" else re.escape(c) for c in glob)


__all__ = ["DEFAULT_DROP_PARAMS", "RAW", "RULE_KEY", "RULE_VERSION", "UrlRule", "http_urls", "normalize",
           "normalize_distinct", "recorded", "report_line"]


# scheme :// [userinfo @] host: the host of an absolute URL (an IPv6 literal with its brackets)
_HOST = r"^[A-Za-z][A-Za-z0-9+.\-]*://(?:[^/?#@]*@)?(?P<host>\[[^\]/]*\]|[^/?#:@]+)"


def hosts(values: pa.Array) -> pa.Array:
    """The host of each absolute URL of `values`, lower-cased; null for any other token (a word, an item id)."""
    found = pc.extract_regex(values, _HOST)
    return pc.utf8_lower(pc.struct_field(found, "host"))
