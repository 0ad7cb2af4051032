"""Where a micro-batch's time goes: the batched kernel (kernels.train) against the fused one (--kernel fused).

    python benchmarks/kernel_profile.py --device cuda --json kernel_profile.json    # on a GPU machine
    python benchmarks/kernel_profile.py --device cpu --examples 32768 --micro-batch 4096   # here: the interpreter

One macro-batch of synthetic PV-DBOW examples as the token path draws them on a device (documents'
rows in a compact `inputs`, Zipf-distributed URLs, each example's own negatives from the unigram^0.75
table: device_examples), trained by each kernel in --kernels, --repeats times after one untimed call
(CUDA: Triton's compile, cuBLAS's start). For each kernel it reports:

- wall: the macro-batch's seconds (CUDA events on a GPU, perf_counter on the CPU), per micro-batch,
  and examples (tokens) per second;
- launches and device time (torch.profiler, one macro-batch): the device kernels it started and the
  sum of their durations. Device time against wall says what bounds a kernel: a dozen small launches
  a micro-batch (device busy a small part of the wall) or the math and memory (busy most of it). The
  batched kernel's device time is also the best that CUDA graphs over its step could reach: a graph
  removes the launches, not the kernels or the intermediates ([B, 1+k, dim] gathers) they write;
- on the CPU, the torch operations that took most of the profiled time;
- max_abs_diff: how far the kernel's updated rows lie from the batched kernel's after one macro-batch
  from the same rows (atomic adds sum in any order: float tolerance, about 1e-6 here).

On the CPU the fused kernel runs under Triton's interpreter (its numpy stand-in for the device): its
time there says nothing of a GPU's, only that the same code runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from harness import save_json


def examples(device, n: int, docs: int, urls: int, negative: int, seed: int):
    """n PV-DBOW examples on `device`: ctx [n, 1] (document rows), target [n], neg and its mask [n, k]."""
    import torch

    from doc2vec_dist.device_examples import DeviceTables, generator
    from doc2vec_dist.sampling import NegativeTable

    counts = np.maximum(1, (1e6 / np.arange(1, urls + 1)) ** 0.9).astype(np.int64)  # Zipf-like URL counts
    tables = DeviceTables(np.ones(urls, np.float32), NegativeTable(counts, 0.75), device)
    gen = generator(seed, device)
    p = torch.as_tensor(counts / counts.sum(), dtype=torch.float32, device=device)
    target = torch.multinomial(p, n, replacement=True, generator=gen)
    ctx = torch.randint(0, docs, (n, 1), generator=gen, device=device)
    neg = tables.draw((n, negative), gen)
    return ctx, target, neg, neg != target[:, None]


def tables(device, docs: int, urls: int, dim: int, adagrad: bool, seed: int):
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    width = dim + int(adagrad)
    inputs = (torch.rand((docs, width), generator=gen) - 0.5) / dim
    outputs = (torch.rand((urls, width), generator=gen) - 0.5) / dim  # not zero: every product counts
    if adagrad:
        inputs[:, dim] = outputs[:, dim] = 0.0
    return inputs.to(device), outputs.to(device)


def profile(run, device) -> dict:
    """One call of `run` under torch.profiler: device kernels launched, their summed time, and on the
    CPU the operations that took most of it."""
    import torch
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
    found = {}
    if device.type == "cuda":
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        found["launches"] = len(kernels)
        found["device_seconds"] = sum(e.time_range.elapsed_us() for e in kernels) / 1e6
    else:
        ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in ops) or 1
        found["top_ops"] = [{"op": e.key, "calls": e.count, "share": round(e.self_cpu_time_total / total, 3)}
                            for e in ops[:8]]
    return found


def measure(name: str, train, args, device, inputs0, outputs0, repeats: int) -> tuple[dict, tuple]:
    """The kernel's figures, and the rows after its first macro-batch (for the comparison)."""
    import torch

    ctx, target, neg, mask, alphas, micro, adagrad = args
    n = int(target.shape[0])

    def run(inputs, outputs):
        return train(inputs, outputs, ctx, target, neg, mask, alphas, micro, adagrad=adagrad)

    first = (inputs0.clone(), outputs0.clone())
    t0 = time.perf_counter()
    run(*first)  # Triton's compile (or the interpreter's first walk), cuBLAS's handles: off the clock
    if device.type == "cuda":
        torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    inputs, outputs = inputs0.clone(), outputs0.clone()
    walls = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(inputs, outputs)
            end.record()
            end.synchronize()
            walls.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            run(inputs, outputs)
            walls.append(time.perf_counter() - t0)
    wall = float(np.median(walls))
    n_micro = -(-n // micro)
    result = {"kernel": name, "first_call_seconds": round(warm, 4), "seconds": round(wall, 5),
              "micro_batch_ms": round(wall / n_micro * 1e3, 4), "tokens_per_second": n / wall}
    result.update(profile(lambda: run(inputs, outputs), device))
    if "device_seconds" in result:
        result["device_busy"] = round(result["device_seconds"] / wall, 3)
        result["launches_per_micro_batch"] = round(result["launches"] / n_micro, 1)
    return result, first


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda or cpu")
    ap.add_argument("--kernels", nargs="+", default=["batched", "fused"], choices=["batched", "fused"])
    ap.add_argument("--examples", type=int, default=1 << 20, help="examples in the macro-batch (tokens: PV-DBOW)")
    ap.add_argument("--micro-batch", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--negative", type=int, default=5)
    ap.add_argument("--urls", type=int, default=250_000, help="rows of words_out, all resident (the token path)")
    ap.add_argument("--docs", type=int, default=40_000, help="document rows the macro-batch trains")
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adagrad"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--block", type=int, default=None, help="examples a fused program takes (default: its own)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.device == "cpu":  # Triton's interpreter is chosen as triton is first imported, which torch.profiler does
        os.environ.setdefault("TRITON_INTERPRET", "1")

    import torch

    from doc2vec_dist import kernels, triton_kernel

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: torch sees no CUDA device here (--device cpu runs the fused kernel under "
              "Triton's interpreter)", file=sys.stderr)
        return 2
    if "fused" in args.kernels and not triton_kernel.available():
        print(f"error: {triton_kernel.MISSING}", file=sys.stderr)
        return 2
    adagrad = args.optimizer == "adagrad"
    ctx, target, neg, mask = examples(device, args.examples, args.docs, args.urls, args.negative, args.seed)
    n_micro = -(-args.examples // args.micro_batch)
    alphas = torch.linspace(0.025, 0.02, n_micro, device=device)
    inputs0, outputs0 = tables(device, args.docs, args.urls, args.dim, adagrad, args.seed)
    run_args = (ctx, target, neg, mask, alphas, args.micro_batch, adagrad)
    trains = {"batched": kernels.train,
              "fused": lambda *a, **k: triton_kernel.train(*a, **k, block=args.block)}
    info = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "triton": _version("triton"), "examples": args.examples,
            "micro_batch": args.micro_batch, "dim": args.dim, "negative": args.negative, "urls": args.urls,
            "docs": args.docs, "optimizer": args.optimizer,
            "interpreted": device.type == "cpu" and "fused" in args.kernels}
    runs, rows = [], {}
    for name in args.kernels:
        result, rows[name] = measure(name, trains[name], run_args, device, inputs0, outputs0, args.repeats)
        runs.append(result)
    if "batched" in rows:
        for result in runs:
            mine, theirs = rows[result["kernel"]], rows["batched"]
            result["max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(mine, theirs))
    for r in runs:
        line = (f"[kernel_profile] {r['kernel']:8s} {r['seconds']:.4f} s a macro-batch of {args.examples:,}, "
                f"{r['micro_batch_ms']:.3f} ms a micro-batch of {args.micro_batch:,}, {r['tokens_per_second'] / 1e6:.2f}M "
                f"tokens/s; max |diff| from batched {r.get('max_abs_diff', 0):.2e}")
        if "launches" in r:
            line += (f"; {r['launches_per_micro_batch']} launches a micro-batch, device busy {r['device_busy']:.0%} "
                     f"({r['device_seconds']:.4f} s)")
        print(line)
        for op in r.get("top_ops", [])[:5]:
            print(f"    {op['op']:40s} {op['calls']:6d} calls {op['share']:.0%}")
    if args.json:
        save_json({**info, "runs": runs}, args.json)
    return 0


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
