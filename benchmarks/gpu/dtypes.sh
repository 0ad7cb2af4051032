#!/usr/bin/env bash
# The same benchmarks/gpu_bench.py run in float32, bfloat16 and float16 (--dtype), one after another in one call:
# tokens/s per epoch and held-out recall for each, in $OUT/summary.md. Carried in .gpu/ as check.sh is:
#   on the GPU machine:   bash .gpu/dtypes.sh   (with .gpu/ carried along; about 2 minutes)
#   here, on the CPU (the venv active):   DEVICE=cpu USERS=5000 URLS=3000 EPOCHS=2 bash .gpu/dtypes.sh
set -u
OUT=${OUT:-/tmp/gpu-dtypes}; mkdir -p "$OUT"
DEVICE=${DEVICE:-cuda} USERS=${USERS:-200000} URLS=${URLS:-100000} EPOCHS=${EPOCHS:-3}
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log") 2>&1
if [ -f .gpu/site.tar.xz ] && python3 -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))"; then
  if [ ! -d /tmp/site/ray ]; then
    mkdir -p /tmp/site && tar -xJf .gpu/site.tar.xz -C /tmp/site \
      && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/*.whl
  fi
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
W=/tmp/gpu-dtypes-work; rm -rf "$W"; mkdir -p "$W"
python3 -m doc2vec_dist generate --users "$USERS" --urls "$URLS" --out "$W/gen" --seed 7 \
  && python3 -m doc2vec_dist prepare "$W/gen" --out "$W/corpus" --time-col ts --holdout 0.1 --holdout-out "$W/heldout.parquet" \
  || exit 1
: > "$OUT/summary.md"
echo "| dtype | tokens/s overall | last epoch | recall@10 |" >> "$OUT/summary.md"; echo "|---|---|---|---|" >> "$OUT/summary.md"
for dt in float32 bfloat16 float16; do
  python3 - "$DEVICE" "$dt" "$W/$dt.yaml" <<'PY'
import sys, os, yaml
cfg = yaml.safe_load(open("jobs/configs/gpu.yaml")) or {}
cfg["dtype"] = sys.argv[2]
if sys.argv[1] == "cpu":
    cfg.update(gpus_per_worker=0, cpus_per_worker=min(os.cpu_count() or 1, int(cfg.get("cpus_per_worker", 1))))
yaml.safe_dump(cfg, open(sys.argv[3], "w"))
PY
  echo "=== $dt"
  timeout 100 python3 benchmarks/gpu_bench.py --corpus "$W/corpus" --heldout "$W/heldout.parquet" --config "$W/$dt.yaml" \
    --device "$DEVICE" --epochs "$EPOCHS" --out "$W/model-$dt" --overwrite --json "$OUT/gpu_bench-$dt.json"
  python3 -c "import json; r=json.load(open('$OUT/gpu_bench-$dt.json')); print(f\"| $dt | {r['tokens_per_second']/1e6:.2f}M | {r['last_epoch_tokens_per_second']/1e6:.2f}M | {r.get('heldout',{}).get('model_recall@10',0):.4f} |\")" >> "$OUT/summary.md" 2>/dev/null
done
cat "$OUT/summary.md"
