#!/usr/bin/env bash
# One command on the GPU machine that does the whole GPU check and leaves a table under $OUT.
# Prepared here, so that the machine's few minutes go to measuring, not to typing.
#
#   here, once:   ../shared/gpu/pack.sh && cp benchmarks/gpu/*.sh .gpu/
#                 (the pack: Ray, gensim and faiss for the device's Python 3.12, in .gpu/, which git ignores;
#                 pack.sh copies its own starting-point check.sh there: this one replaces it)
#   on the GPU machine:   bash .gpu/check.sh   (with .gpu/ carried along; allow it 590 s)
#   here, to try it on the CPU first (small, no GPU; the venv active, whose Python is not 3.12, so the pack is not used):
#       DEVICE=cpu USERS=20000 URLS=10000 BUDGET=300 SCALE_WORKERS="2" SCALE_THREADS="2" bash .gpu/check.sh
#
# Steps, each timed and each allowed to fail without stopping the others (issue 48: the mission's path first):
#   1. install what .gpu/ carries (Ray, gensim, faiss), nvidia-smi
#   2. generate USERS x URLS synthetic browsing logs and prepare them with a held-out split
#   3. benchmarks/gpu_bench.py --ray: one worker on the device through Ray (`train` itself: servers and worker Ray
#      actors, a checkpoint at each epoch's end), tokens/s per epoch, recall@10
#   4. the same, two workers sharing the device (Ray's num_gpus 0.5 each, the block schedule)
#   5. benchmarks/gpu_bench.py: one worker on the device against in-process servers (the in-process figure), once per
#      table dtype in DTYPES (issue 29)
#   5b. benchmarks/kernel_profile.py: the batched kernel against the fused one (--kernel fused, Triton) on one
#      macro-batch: ms a micro-batch, launches and device busy (torch.profiler), their updates' max difference;
#      then gpu_bench.py --kernel fused in-process, tokens/s and recall@10 beside step 5's (FUSED; issue 48, item 2)
#   6. benchmarks/feed_rate.py through Ray: the host side alone (no kernel), and with the kernel; --no-ray where time is left
#   7. gensim on every core (corpus_file mode, its fastest) on the same corpus and settings
#   8. prepare_benchmark.py on a generated PREP_USERS-user corpus, --parallel PREP_PARALLEL (issue 30; off by default)
#   9. benchmarks/kernel_bound.py: the CPU kernel alone in N processes at once, the machine's own bound on W workers'
#      parallel efficiency (BOUND_PROCESSES; issue 27; off by default)
#  10. benchmarks/scaling.py on every core: CPU workers W = SCALE_WORKERS and one worker with SCALE_THREADS threads beside
#      gensim: the machine's cores at their best (8 workers, or one of 16 threads, measured before), to set the GPU against
# Everything printed goes to $OUT/log too; figures go to $OUT/*.json and one table, $OUT/summary.md, which ends with
# the GPU through Ray against the CPU cores' best, in the same call.
set -u
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
DEVICE=${DEVICE:-cuda} USERS=${USERS:-500000} URLS=${URLS:-250000} EPOCHS=${EPOCHS:-3} BUDGET=${BUDGET:-480}
SCALE_WORKERS=${SCALE_WORKERS-8} SCALE_THREADS=${SCALE_THREADS-16} BOUND_PROCESSES=${BOUND_PROCESSES-}
# gpu_bench once per table dtype (issue 29, resolved: float32 by default, so that the steps through Ray have their
# time); DTYPE:dtype keeps the device's URL rows in that dtype too (--device-rows dtype), e.g. "bfloat16:dtype float16:dtype"
DTYPES=${DTYPES-float32}
# issue 48, item 2: the fused Triton kernel (--kernel fused) against the batched one: the kernel alone
# (benchmarks/kernel_profile.py: ms a micro-batch, launches, device busy, max diff), then gpu_bench in-process with it
# (FUSED= to skip; FUSED_EPOCHS: its epochs, on the CPU under Triton's interpreter keep it at 1)
FUSED=${FUSED-1} FUSED_EPOCHS=${FUSED_EPOCHS:-$EPOCHS}
# prepare's scaling (issue 30, closed): off unless asked for, e.g. PREP_PARALLEL="1 4 8 16"
PREP_USERS=${PREP_USERS:-5000000} PREP_EVENTS=${PREP_EVENTS:-12} PREP_PARALLEL=${PREP_PARALLEL-}
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log") 2>&1
start=$SECONDS
left() { echo $(( BUDGET - (SECONDS - start) )); }
step() { echo; echo "=== $1 (t=$((SECONDS - start))s, $(left)s left)"; }
summary() { echo "$1" >> "$OUT/summary.md"; }
: > "$OUT/summary.md"
summary "| step | result | seconds |"; summary "|---|---|---|"

step "install"
t=$SECONDS
if [ -f .gpu/site.tar.xz ] && python3 -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))"; then  # the pack is for 3.12 (the device); a CPU try uses its own venv
  mkdir -p /tmp/site && tar -xJf .gpu/site.tar.xz -C /tmp/site \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/*.whl
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>/dev/null || echo "no nvidia-smi"
# what the device's Python offers for a kernel of our own (issue 48, item 2): triton (torch's CUDA build brings it), nvcc, numba.cuda
python3 -c "
import importlib.util, shutil
def has(m):
    try:
        return importlib.util.find_spec(m) is not None
    except ImportError:
        return False
import importlib.metadata as md
print('triton', md.version('triton') if has('triton') else 'absent', '; nvcc', shutil.which('nvcc') or 'absent',
      '; numba.cuda', 'present' if has('numba') and has('numba.cuda') else 'absent')" | tee "$OUT/kernel_tools.txt"
nproc; free -g | head -2; lscpu 2>/dev/null | grep -i -E "model name|^socket|core|thread|mhz" || true
summary "| kernel tools | $(cat "$OUT/kernel_tools.txt" 2>/dev/null) | |"
summary "| install | $(python3 -c 'import ray, gensim, faiss; print("ray", ray.__version__, "gensim", gensim.__version__)' 2>&1 | tail -1) | $((SECONDS - t)) |"

step "corpus: $USERS users x $URLS URLs"
t=$SECONDS
W=${WORK:-/tmp/gpu-check-work}; rm -rf "$W"; mkdir -p "$W"  # WORK: where its corpus and models go
python3 -m doc2vec_dist generate --users "$USERS" --urls "$URLS" --out "$W/gen" --seed 7 \
  && python3 -m doc2vec_dist prepare "$W/gen" --out "$W/corpus" --time-col ts --holdout 0.1 --holdout-out "$W/heldout.parquet"
rc=$?
summary "| corpus | rc $rc, $(python3 -c "import json; c=json.load(open('$W/corpus/corpus.json')); print(c.get('num_docs', c.get('docs')), 'docs', c.get('num_tokens', c.get('tokens')), 'tokens')" 2>/dev/null) | $((SECONDS - t)) |"
[ $rc = 0 ] || { echo "no corpus: stopping"; exit 1; }

# gpu.yaml as it is on CUDA; with the CPU as the device (a trial run here), no GPU and this machine's CPUs
CFG="$W/check.yaml"
python3 - "$DEVICE" "$CFG" <<'PY'
import sys, os, yaml
cfg = yaml.safe_load(open("jobs/configs/gpu.yaml")) or {}
if sys.argv[1] == "cpu":
    cfg.update(gpus_per_worker=0, cpus_per_worker=min(os.cpu_count() or 1, int(cfg.get("cpus_per_worker", 1))))
yaml.safe_dump(cfg, open(sys.argv[2], "w"))
PY

for workers in 1 2; do
  step "through Ray: $workers worker(s) on $DEVICE, $EPOCHS epochs (gpu_bench --ray)"
  t=$SECONDS
  timeout $(( $(left) > 60 ? $(left) / 4 : 30 )) python3 benchmarks/gpu_bench.py --corpus "$W/corpus" --heldout "$W/heldout.parquet" \
    --config "$CFG" --device "$DEVICE" --epochs "$EPOCHS" --ray --workers "$workers" --out "$W/model-ray$workers" --overwrite \
    --json "$OUT/gpu_ray-$workers.json"
  rc=$?
  summary "| through Ray, $workers worker(s) ($DEVICE) | rc $rc; $(python3 -c "import json; r=json.load(open('$OUT/gpu_ray-$workers.json')); print(f\"{r['tokens_per_second']/1e6:.2f}M tok/s overall, per epoch {', '.join('%.2fM' % (e['tokens_per_second'] / 1e6) for e in r['epochs'])}, {sum(r['bytes_per_token'].values()):.1f} B/token, recall@10 {r.get('heldout',{}).get('model_recall@10','-')}\")" 2>/dev/null) | $((SECONDS - t)) |"
  rm -rf "$W/model-ray$workers"
done

for dt in $DTYPES; do
  step "gpu_bench on $DEVICE, $EPOCHS epochs, dtype $dt"
  t=$SECONDS
  name=${dt/:/-rows-}  # file names without a colon
  python3 - "$CFG" "$dt" "$W/$name.yaml" <<'PY'
import sys, yaml
cfg = yaml.safe_load(open(sys.argv[1])) or {}
cfg["dtype"], _, rows = sys.argv[2].partition(":")
if rows:
    cfg["device_rows"] = rows
yaml.safe_dump(cfg, open(sys.argv[3], "w"))
PY
  timeout $(( $(left) > 60 ? $(left) / 3 : 30 )) python3 benchmarks/gpu_bench.py --corpus "$W/corpus" --heldout "$W/heldout.parquet" \
    --config "$W/$name.yaml" --device "$DEVICE" --epochs "$EPOCHS" --out "$W/model-$name" --overwrite --json "$OUT/gpu_bench-$name.json"
  rc=$?
  summary "| gpu_bench ($DEVICE, $dt) | rc $rc; $(python3 -c "import json; r=json.load(open('$OUT/gpu_bench-$name.json')); print(f\"rows {r.get('device_rows')}: {r['tokens_per_second']/1e6:.2f}M tok/s overall, {r['last_epoch_tokens_per_second']/1e6:.2f}M last epoch, recall@10 {r.get('heldout',{}).get('model_recall@10','-')}\")" 2>/dev/null) | $((SECONDS - t)) |"
  rm -rf "$W/model-$name"
done

if [ -n "$FUSED" ]; then
  step "the kernel alone on $DEVICE: where a micro-batch's time goes, batched against fused (kernel_profile)"
  t=$SECONDS
  # on the CPU the fused kernel runs under Triton's interpreter: a small macro-batch, only to try the step
  small=(); [ "$DEVICE" = cpu ] && small=(--examples 32768 --micro-batch 4096 --docs 4000 --urls 20000 --repeats 2)
  timeout 90 python3 benchmarks/kernel_profile.py --device "$DEVICE" "${small[@]}" --json "$OUT/kernel_profile.json"
  rc=$?
  summary "| kernel alone, batched vs fused ($DEVICE) | rc $rc; $(python3 -c "import json; r=json.load(open('$OUT/kernel_profile.json')); print(f\"triton {r['triton']}, {r['micro_batch']:,}-example micro-batches: \" + '; '.join(f\"{x['kernel']} {x['micro_batch_ms']:.3f} ms ({x['tokens_per_second']/1e6:.1f}M tok/s\" + (f\", {x['launches_per_micro_batch']} launches, device busy {x['device_busy']:.0%}\" if 'launches' in x else '') + f\", max diff {x.get('max_abs_diff', 0):.1e})\" for x in r['runs']))" 2>/dev/null) | $((SECONDS - t)) |"
  step "gpu_bench on $DEVICE, $FUSED_EPOCHS epochs, --kernel fused (float32)"
  t=$SECONDS
  timeout $(( $(left) > 60 ? $(left) / 4 : 30 )) python3 benchmarks/gpu_bench.py --corpus "$W/corpus" --heldout "$W/heldout.parquet" \
    --config "$CFG" --device "$DEVICE" --epochs "$FUSED_EPOCHS" --kernel fused --out "$W/model-fused" --overwrite \
    --json "$OUT/gpu_bench-fused.json"
  rc=$?
  summary "| gpu_bench ($DEVICE, --kernel fused) | rc $rc; $(python3 -c "import json; r=json.load(open('$OUT/gpu_bench-fused.json')); print(f\"{r['tokens_per_second']/1e6:.2f}M tok/s overall, {r['last_epoch_tokens_per_second']/1e6:.2f}M last epoch, recall@10 {r.get('heldout',{}).get('model_recall@10','-')}\")" 2>/dev/null) | $((SECONDS - t)) |"
  rm -rf "$W/model-fused"
fi

for ray in "" --no-ray; do
  [ -n "$ray" ] && [ "$(left)" -lt 240 ] && continue  # the feed without Ray only where time is left
  step "host feed ${ray:-through Ray} (no kernel, then the kernel)"
  t=$SECONDS
  timeout $(( $(left) > 60 ? $(left) / 4 : 30 )) python3 benchmarks/feed_rate.py --corpus "$W/corpus" --config "$CFG" --device "$DEVICE" \
    $ray --json "$OUT/feed_rate$ray.json"
  rc=$?
  summary "| feed_rate ${ray:-through Ray} | rc $rc; $(python3 -c "import json; print('; '.join(f\"kernel {x.get('kernel')}: {x['tokens_per_second']/1e6:.2f}M tok/s\" for x in json.load(open('$OUT/feed_rate$ray.json'))['runs']))" 2>/dev/null) | $((SECONDS - t)) |"
done

step "gensim, corpus_file, every core, 1 epoch"
t=$SECONDS
timeout $(( $(left) > 60 ? $(left) / 2 : 30 )) python3 -m doc2vec_dist baseline --corpus "$W/corpus" --out "$W/gensim" --gensim-mode corpus_file \
  --mode dbow --dim 100 --negative 5 --epochs 1 --overwrite > "$OUT/gensim.log" 2>&1
rc=$?; tail -3 "$OUT/gensim.log"
summary "| gensim corpus_file, $(nproc) threads, 1 epoch | rc $rc; $(grep -o '[0-9.]*M tokens/s' "$OUT/gensim.log" | tail -1) | $((SECONDS - t)) |"

if [ -n "$PREP_PARALLEL" ] && [ "$(left)" -gt 120 ]; then
  step "prepare on every core: $PREP_USERS users x $PREP_EVENTS events, --parallel $PREP_PARALLEL (issue 30)"
  t=$SECONDS
  rm -rf "$W/model"* "$W/gensim"
  timeout $(( $(left) - 10 )) bash -c "python3 -m doc2vec_dist generate --users $PREP_USERS --urls $((PREP_USERS / 5)) --events-per-user $PREP_EVENTS \
      --out $W/gprep --seed 11 --no-progress && python3 benchmarks/prepare_benchmark.py $W/gprep --out $W/prep --parallel $PREP_PARALLEL -- --time-col ts"
  rc=$?; cp "$W/prep/result.json" "$OUT/prepare_scaling.json" 2>/dev/null
  summary "| prepare, $(nproc) cores, --parallel $PREP_PARALLEL | rc $rc; $(python3 -c "import json; r=json.load(open('$OUT/prepare_scaling.json')); print('; '.join(f\"{x['run']}: {x['wall_seconds']:.1f} s wall, passes {x['pass_seconds']['total']:.1f} s, {x.get('speedup', 1)}x\" for x in r['runs']))" 2>/dev/null) | $((SECONDS - t)) |"
fi

if [ -n "$BOUND_PROCESSES" ] && [ "$(left)" -gt 90 ]; then
  step "the CPU kernel alone in $BOUND_PROCESSES processes at once: the machine's bound on parallel efficiency"
  t=$SECONDS
  timeout 120 python3 benchmarks/kernel_bound.py --processes $BOUND_PROCESSES --tokens 3000000 --json "$OUT/kernel_bound.json"
  rc=$?
  summary "| kernel alone, N processes | rc $rc; $(python3 -c "import json; r=json.load(open('$OUT/kernel_bound.json')); print(f\"threads/core {r['threads_per_core']}: \" + ', '.join(f\"{x['processes']}: {x['tokens_per_second']/1e6:.2f}M ({x['efficiency']:.2f})\" for x in r['runs']))" 2>/dev/null) | $((SECONDS - t)) |"
fi

if [ -n "$SCALE_WORKERS" ] && [ "$(left)" -gt 60 ]; then
step "scaling on every core: CPU workers W = $SCALE_WORKERS (block schedule), one worker with T = $SCALE_THREADS threads beside gensim"
t=$SECONDS
timeout $(( $(left) > 40 ? $(left) - 20 : 20 )) python3 benchmarks/scaling.py --corpus "$W/corpus" --workers $SCALE_WORKERS \
  --threads $SCALE_THREADS --epochs 1 --num-ps 4 --workdir "$W/scaling" --json "$OUT/scaling.json"
rc=$?
summary "| scaling, $(nproc) cores, 1 epoch | rc $rc; $(python3 -c "import json; r=json.load(open('$OUT/scaling.json')); print('workers ' + ', '.join(f\"{x['workers']}: {x['tokens_per_second']/1e6:.2f}M ({x['efficiency']:.2f}, {x.get('segments', 1)} segment(s), barrier {100*x['worker_seconds']['barrier']/max(sum(x['worker_seconds'].values()),1e-9):.0f}%)\" for x in r['workers']) + '; threads ours/gensim ' + ', '.join(f\"{x['threads']}: {x['ours']['tokens_per_second']/1e6:.2f}M/{x.get('gensim',{}).get('tokens_per_second',0)/1e6:.2f}M\" for x in r['threads']))" 2>/dev/null) | $((SECONDS - t)) |"
grep "\[scaling\]" "$OUT/log" | sed 's/^/    /' >> "$OUT/summary.md"
fi
# the GPU through Ray (its last epoch) against the CPU cores' best in this call (W CPU workers, or one of T threads)
summary "| GPU through Ray vs the CPU cores | $(python3 -c "
import json
gpu = json.load(open('$OUT/gpu_ray-1.json'))['last_epoch_tokens_per_second']
s = json.load(open('$OUT/scaling.json'))
best = max([r['tokens_per_second'] for r in s['workers']] + [r['ours']['tokens_per_second'] for r in s['threads']])
print(f'{gpu/1e6:.2f}M / {best/1e6:.2f}M = {gpu/best:.1f}x')" 2>/dev/null) | |"
echo; cat "$OUT/summary.md"
