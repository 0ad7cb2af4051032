"""The README's picture: our quality and speed beside gensim's, one pair of bars per data set.

    python benchmarks/quality.py --json runs/quality.json
    python benchmarks/plot.py runs/quality.json --out docs/img/quality-vs-gensim.png

Reads the JSON that benchmarks/quality.py writes ({"results": [...]}: per set and mode, each trainer's
mean figure and tokens/s, measured in the same run) and draws two panels: the figure of each set
(Pearson, k-NN accuracy or recall@10: each set's own metric, so the bars compare within a set only)
and tokens/s. Results of a --workers or --tune run (no ours-against-gensim pair) are left out.
"""

from __future__ import annotations

import argparse
import json
import sys

OURS, GENSIM = "doc2vec-dist", "gensim"


def pairs(data: dict) -> list[dict]:
    """The results that hold ours and gensim side by side, in the file's order."""
    return [r for r in data.get("results", []) if OURS in r and GENSIM in r and "differences" not in r]


def label(result: dict) -> str:
    mode = "" if result.get("mode", "dbow") == "dbow" else f" ({result['mode']})"
    return f"{result['set']}{mode}\n{result.get('metric', '')}"


def plot(results: list[dict], out: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(results))
    width = 0.38
    fig, (quality, speed) = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, key, scale, ylabel in ((quality, "mean", 1.0, "figure (higher is better)"),
                                   (speed, "tokens_per_second", 1e6, "million tokens/s")):
        for shift, who, colour in ((-width / 2, OURS, "#1f77b4"), (width / 2, GENSIM, "#aaaaaa")):
            values = [r[who][key] / scale for r in results]
            bars = ax.bar(x + shift, values, width, label="gensim (iterable)" if who == GENSIM else who, color=colour)
            ax.bar_label(bars, fmt="%.3f" if key == "mean" else "%.2f", fontsize=7, padding=1)
        ax.set_xticks(x, [label(r) for r in results], fontsize=7)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    quality.set_title("quality: each set's own metric")
    speed.set_title("training speed")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="the JSON benchmarks/quality.py wrote (--json)")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--title", default="", help="a line above the panels (say the date and machine)")
    args = ap.parse_args(argv)
    try:
        with open(args.json) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as e:
        print(f"error: cannot read {args.json}: {e}", file=sys.stderr)
        return 2
    results = pairs(data)
    if not results:
        print(f"error: {args.json} holds no result with both {OURS} and {GENSIM} (a --workers or --tune run?)",
              file=sys.stderr)
        return 2
    plot(results, args.out, args.title)
    print(f"wrote {args.out}: {len(results)} set(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
