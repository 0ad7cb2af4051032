"""The plan as text: format_plan's report (memory, time, the scaling table), and the line train gives
when it takes fewer workers (faster_fewer).

Changes when what `doc2vec-dist plan` prints changes.
"""

from __future__ import annotations

import itertools

from .config import TableSpec
from .plan_model import EXCHANGE_SECONDS, ROUND_SECONDS, GiB

# -- output ---------------------------------------------------------------------------------------------

def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _gb(n: float | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f} GiB" if n >= 0.1 * GiB else f"{n / 2**20:.0f} MiB"


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.1f} s" if x < 600 else f"{x:,.0f} s ({x / 3600:.2f} h)"


def format_plan(p: dict) -> str:
    c, cfg, mem, prof = p["corpus"], p["config"], p["memory"], p["macro_batch"]
    src = mem["sources"]
    words_out = TableSpec.from_json("words_out", p["tables"]["words_out"])
    width, row_bytes = words_out.width, words_out.row_bytes
    mode = cfg["mode"] + (" + dbow_words" if cfg["dbow_words"] else "")
    est = p.get("estimate")
    if est:  # no corpus read whole: its figures come from a sample standing for it
        lines = [(f"plan: an estimate for {est['users']:,} users × {est['tokens_per_user']:,.1f} tokens over "
                 f"{est['urls']:,} URLs, from {est['sample_docs']:,} users standing for them")]
        lines.append(f"  estimate: {est['assumption']}")
    else:
        lines = [f"plan: {c['path']}"]
    lines.append(f"  corpus {c['docs']:,} docs, {c['tokens']:,} tokens ({c['tokens_per_doc']:.1f} a doc), "
                 f"vocabulary {c['vocab']:,}")
    if cfg.get("first_epoch") == "changed":
        lines.append(f"  first epoch (--first-epoch changed): only the users a refresh changed, "
                     f"{c['first_epoch_tokens']:,} of the {c['tokens']:,} tokens")
    lines.append(f"  {mode}, dim {cfg['dim']}, negative {cfg['negative']}, optimizer {cfg['optimizer']}, "
                 f"{_n(cfg['num_ps'], 'parameter server')}, {_n(cfg['num_workers'], 'worker')}, {_n(cfg['epochs'], 'epoch')}")
    lines.append(f"  macro-batch {prof['macro_batch']:,} tokens: {prof['examples']:,} examples, unique rows "
                 f"{prof['docs']:,} docs + {prof['words']:,} words + {prof['words_out']:,} words_out "
                 f"= {_gb(prof['unique_rows'] * row_bytes)} pulled and pushed"
                 + (f" ({words_out.dtype})" if words_out.dtype != "float32" else ""))
    res = mem["resident"]
    held = " + ".join(f"{n} {'all ' if res['all'] else ''}{r:,} rows" for n, r in res["tables"].items() if r)
    lines.append(f"  resident in each worker (its {res['on']} memory): "
                 + (f"{held} = {_gb(res['bytes'])}" if held else "none")
                 + (f" (words_out in {res['dtype']})" if res["dtype"] != "float32" else ""))
    parts = res.get("document_partitions", 0)
    lines.append("  documents' rows: " + (
        "pulled and pushed with each macro-batch" if not parts else
        "kept in each worker across epochs: pulled once, written back at each checkpoint and the run's end"
        if parts == 1 else
        f"swapped by partition: up to {parts} partitions, each pulled and written back once an epoch"))
    device = p.get("device")
    if device and device.get("document_room") is not None:
        lines.append(f"    (room for them: {_gb(device['document_room'])} of the {device['model']}'s "
                     f"{device['memory_bytes'] / 1e9:g} GB, as a worker sizes it at its start; --device-memory sets it)")
    elif cfg.get("device_memory") is not None and parts:
        lines.append(f"    (room for them: --device-memory {cfg['device_memory']:g} GiB)")
    ways = p.get("documents")
    if ways:
        def way(name: str) -> str:
            w = ways[name]
            return f"{w['bytes_per_token']:.1f}" + (f" ({w['pcie_bytes_per_token']:.1f} over PCIe)"
                                                    if w["pcie_bytes_per_token"] is not None else "")
        taken = {0: "neither: they stream", 1: "kept"}.get(ways["way"], "partitions")
        lines.append(f"    bytes a token to and from the servers: kept across epochs {way('kept')}, in partitions "
                     f"{way('partitions')}; this run: {taken}")

    def row(label: str, value: str, how: str) -> None:
        lines.append(f"  {label:<34}{value:>14}   {how}")

    lines.append("")
    row("memory (private, per process)", "planned", "how")
    big = max(mem["ps"], key=lambda x: x["total"])
    parts = ", ".join(f"{n} {b / row_bytes:,.0f} rows" for n, b in big["tables"].items())
    row(f"parameter server (largest of {len(mem['ps'])})", _gb(big["total"]),
        f"rows {_gb(big['table_bytes'])} ({parts} × {row_bytes} B) + overhead {_gb(big['overhead'])} "
        f"[{src['ps_overhead']}]")
    w = mem["worker"]
    row("worker (each)", _gb(w["total"]), f"batches {_gb(w['batch'])} (2 × examples + 2 × {prof['unique_rows']:,} "
        f"rows × {width} × 4 B) + resident {_gb(w['resident'])} + fixed {_gb(w['fixed'])} [{src['worker_fixed']}]")
    row("driver", _gb(mem["driver"]), f"[{src['driver']}]")
    row("Ray processes (raylet, GCS, …)", _gb(mem["ray_system"]), f"[{src['ray_system']}]")
    st = mem["object_store"]
    row("object store (shared, capacity)", _gb(st["capacity"]),
        f"in flight ≈ {_gb(st['in_flight'])} ({_n(cfg['num_workers'], 'worker')} × (2 pulls + "
        f"{cfg['max_inflight_pushes']} pushes) × {_gb(st['macro_batch_rows_bytes'])})")
    row("node total (all on one node)", _gb(mem["node_total"]), f"of {_gb(p['node_ram'])} on this machine")
    t = p.get("time")
    if t:
        cal = p["calibration"]
        split = t["worker_seconds"]
        busy = sum(split.values()) or 1.0
        what = "a slice" if cal["sliced"] else "the whole corpus"
        lines.append("")
        row("time", "planned", "how")
        two = cal.get("two_point")
        how = (f"calibration: two slices, {two['tokens'][0]:,} and {two['tokens'][1]:,} tokens in "
               f"{two['seconds'][0]:.1f} and {two['seconds'][1]:.1f} s: the difference's rate"
               if two else f"calibration: {what}, {cal['corpus_tokens']:,} tokens ({cal['corpus_docs']:,} docs) × "
               f"{cal['epochs']} epochs in {t['calibration_train_seconds']:.1f} s")
        scaled = t.get("scaled_from_workers")
        if scaled:
            row("tokens/s", f"{t['tokens_per_second'] / 1e6:.3f}M",
                f"{_n(scaled, 'worker')} calibrated, its rate scaled to {_n(cfg['num_workers'], 'worker')} by the "
                "scaling table (below)")
            row("", f"{cal['summary']['tokens_per_second'] / 1e6:.3f}M", f"the {_n(scaled, 'worker')}'s {how}")
        else:
            row("tokens/s", f"{t['tokens_per_second'] / 1e6:.3f}M", how)
        row("", "", "worker time: " + " ".join(f"{k} {100 * v / busy:.0f}%" for k, v in split.items()))
        row("per epoch", _s(t["epoch_seconds"]), f"{c['tokens']:,} tokens / tokens/s")
        changed = cfg.get("first_epoch") == "changed"
        if changed:
            row("first epoch", _s(t["first_epoch_seconds"]),
                f"{c['first_epoch_tokens']:,} tokens of the users a refresh changed (--first-epoch changed) / tokens/s")
        row("startup", _s(t["startup_seconds"]),
            f"calibration's + each server's extra rows × {t['ps_init_seconds_per_row'] * 1e6:.2f} µs")
        row("checkpoint (each)", _s(t["checkpoint_seconds"]),
            f"table bytes at {_gb(t['checkpoint_bytes_per_second'])}/s (calibration's rate)")
        every = cfg["checkpoint_every"]
        row("whole run", _s(t["total_seconds"]),
            f"startup + {_n(cfg['epochs'], 'epoch')}" + (" (the first on the changed users)" if changed else "")
            + f" + {_n(t['checkpoints'], 'checkpoint')} ("
            + (f"one at each epoch's end and one each {every:g} s of training since the last: --checkpoint-every"
               if every > 0 else "at the end alone: --checkpoint-every 0") + ")")
    if p.get("scaling"):
        lines.append("")
        lines.append(f"  scaling ({'the block schedule' if cfg.get('schedule') != 'shared' else 'shared rows'} where "
                     f"it applies; links of {p['network_gbps']:g} Gbit/s, one per worker and {cfg['num_ps']} on the "
                     f"servers' side; Ray calls at {ROUND_SECONDS * 1e3:.0f} ms a round and {EXCHANGE_SECONDS * 1e3:.0f} ms an "
                     "exchange of held rows a server; tokens/s each limit "
                     "allows alone, but the bound's: what it allows with the time the others add, the expectation)")
        if device:  # GPU workers: the device and its host-device link beside the servers and the network
            lines.append(f"  device: {device['model']} (--gpu-model), {device['tokens_per_second'] / 1e6:.2f}M "
                         f"tokens/s a GPU ({device['source']}); PCIe: {device['pcie_bytes_per_second'] / 1e9:g} GB/s "
                         f"a GPU ({device['pcie_source']})")
            lines.append(f"  its memory's ceiling: {device['hbm_tokens_per_second'] / 1e6:.0f}M tokens/s a GPU "
                         f"({device['hbm_bytes_per_second'] / 1e12:.2f} TB/s, {device['hbm_source']}, over the "
                         f"{device['device_bytes_per_token']:,} B a token's pair reads and writes); the kernel at "
                         f"{device['tokens_per_second'] / device['hbm_tokens_per_second']:.1%} of it")
            lines.append(f"  {'GPUs':>6} {'workers':>8} {'bytes/token':>12} {'PCIe B/token':>13} {'device':>10} "
                         f"{'pcie':>10} {'servers':>10} {'network':>10} {'calls':>10} {'expected':>10}  bound")
        else:
            lines.append(f"  {'workers':>8} {'bytes/token':>12} {'compute':>10} {'servers':>10} {'network':>10} "
                         f"{'calls':>10} {'expected':>10}  bound")
        for r in p["scaling"]:
            rate = r["rates"]
            if device:
                lines.append(f"  {r['gpus']:>6g} {r['workers']:>8} {r['total_bytes_per_token']:>12.1f} "
                             f"{r['total_pcie_bytes_per_token']:>13.1f} "
                             + " ".join(f"{_m(rate.get(k)):>10}" for k in ("device", "pcie", "servers", "network", "calls"))
                             + f" {_m(r['tokens_per_second']):>10}  {r['bound'] or '-'}")
                continue
            lines.append(f"  {r['workers']:>8} {r['total_bytes_per_token']:>12.1f} "
                         + " ".join(f"{_m(rate.get(k)):>10}" for k in ("compute", "servers", "network", "calls"))
                         + f" {_m(r['tokens_per_second']):>10}  {r['bound'] or '-'}")
        lines.extend(more_servers_lines(p["scaling"]))
        if p.get("scaling_unlisted"):
            gone = p["scaling_unlisted"]
            lines.append(f"  not listed: {', '.join(map(str, gone['workers']))} workers ({gone['why']})")
        asked = cfg["num_workers"]
        then = None if cfg.get("force_workers") else faster_fewer(p["scaling"], asked)
        if then:
            got = next(r for r in p["scaling"] if r["workers"] == asked)
            lines.append(f"  train takes {_n(then['workers'], 'worker')} here, not {asked}: "
                         f"{_m(then['tokens_per_second'])} tokens/s against {_m(got['tokens_per_second'])} "
                         f"(bound: {got['bound']}); --force-workers trains with {asked}")
    for warning in p["warnings"]:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


# A row whose workers gain less than this over the row before (twice as many, or what the table lists) is
# "no faster": the links on the servers' side, or the servers, are full; more servers is then the way on.
NO_FASTER = 1.1


def more_servers_lines(scaling: list[dict]) -> list[str]:
    """For each row whose workers train no faster than the row before's (NO_FASTER), or slower, what a
    server per worker would give where that helps, from the same model (scaling_plan's "more_servers")."""
    out = []
    for before, r in itertools.pairwise(scaling):
        more, rate, was = r.get("more_servers"), r["tokens_per_second"], before["tokens_per_second"]
        if not (more and rate and was and rate < NO_FASTER * was and more["tokens_per_second"] >= 1.05 * rate):
            continue
        how = "slower than" if rate < 0.99 * was else "no faster than"
        out.append(f"  {r['workers']} workers are {how} {before['workers']} here: with --num-ps {more['num_ps']} "
                   f"(a server per worker, each on a node of its own) they would train "
                   f"{more['tokens_per_second'] / 1e6:.2f}M tokens/s, {more['tokens_per_second'] / rate:.1f}× "
                   f"(bound: {more['bound']})")
    return out


def faster_fewer(rows: list[dict], asked: int) -> dict | None:
    """Of the scaling table's rows of fewer workers than `asked`, the fastest where it trains at least NO_FASTER
    times the asked-for row's rate (else None): what train takes instead (choose_workers)."""
    got = next((r for r in rows if r["workers"] == asked), None)
    fewer = [r for r in rows if r["workers"] < asked and r["tokens_per_second"]]
    if not got or not got["tokens_per_second"] or not fewer:
        return None
    best = max(fewer, key=lambda r: r["tokens_per_second"])
    return best if best["tokens_per_second"] >= NO_FASTER * got["tokens_per_second"] else None


def _m(rate: float | None) -> str:
    return "-" if not rate else f"{rate / 1e6:.2f}M"
