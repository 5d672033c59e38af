#!/usr/bin/env bash
# GPU pass for issue 11 (training for whole-catalog ranking), sized for one 10-minute device call:
#   1. the CUDA tests (paper and fullrank chains on the GPU; run while AOTM is prepared),
#   2. seconds per epoch of MDR and MASS under the paper and the fullrank recipe, same run,
#   3. the whole AMASR chain under `--recipe fullrank` (1,024 shared negatives), each run under
#      --time-limit, with item-kNN and popularity fitted on the CPU cores beside it,
#   4. `masr evaluate` of the chain with both protocols (test split; the chain's settings were
#      fixed beforehand on validation, docs/training.md).
# GRID=1 also runs search_fullrank.py's "gpu" grid on validation before the chain (longer).
# FUSE_PAIRS="chain_row/amdr+chain/amass ..." (folders under $WORK, e.g. the CHAIN of an
# earlier invocation in the same call) adds eq. 20 fusions of parts from different chains at the
# end, validation and test, by fuse_checkpoints.py (the checkpoints never leave the machine).
# SKIP_TESTS=1 / SKIP_SPEED=1 leave out stages 1 / 2; TESTS_BESIDE=1 runs the CUDA tests beside
# the chain (after the speed stage, so that its timings stay clean) instead of before; CHAIN_ARGS adds options to the chain
# ("--dim 128"); PARALLEL=1 trains MDR beside MASS and AMDR beside AMASS. The pass that
# trained the chain to its validation peaks (docs/training.md): SKIP_TESTS=1 SKIP_SPEED=1
# PARALLEL=1 TIME_LIMIT=250 (452 s on an H100).
#
#   bash benchmarks/device_fullrank.sh      # from the repository root; env as device_check.sh,
#                                           # plus TIME_LIMIT (s per chain run, default 60),
#                                           # FULL_SAMPLE (test cases, default 3000), GRID
set -u
source "$(dirname "$0")/_device_env.sh"

DEVICE=${DEVICE:-cuda}
TL=${TIME_LIMIT:-60}
FULL_SAMPLE=${FULL_SAMPLE:-3000}
DATA_SRC=${DATA_SRC:-../shared/data/aotm2011.csv.gz}
DATA=$WORK/data
CHAIN=${CHAIN:-$WORK/chain}
# e.g. "--dim 128": one change to the recipe, same budget. CHAIN_ARGS="--dim 256 --adv-lr 3e-4"
# with TIME_LIMIT=180 PARALLEL=1 ran in 438 s on an H200 (docs/training.md, The whole chain at
# d = 256); DATA_SRC must be a path inside the checkout there (../shared does not travel)
# (e.g. .aotm/, excluded from git and named in the call's carry). The next pass by that evidence:
# CHAIN_ARGS="--dim 256 --adv-lr 1e-4" (AMASS at d = 256 peaked in its first two APR epochs at 3e-4);
# and the row dropout that lifted AMDR and MASS on AOTM on a CPU (docs/training.md, Dropout that
# keeps the GEMM form): CHAIN_ARGS="--set dropout=0.5 --set dropout_mode=row". MDR's smaller
# embedding init (docs/training.md, The embedding initialisation scale) is in the recipe now;
# the 1/d rule it replaced: CHAIN_ARGS="--set mdr.init_std=0.015625" (d = 64)
# The recipe to early stopping and row dropout on both parts ran on an H200 in the thirteenth
# session (docs/training.md, "The default recipe's chain on a GPU"): SKIP_SPEED=1 TESTS_BESIDE=1
# PARALLEL=1 TIME_LIMIT=220 CHAIN_ARGS="--patience 3" took 346 s. Next by that evidence, the
# row-dropout MDR side with the recipe's MASS side (on the synthetic set it loses in the fusion:
# docs/training.md), from the same two passes in one call, the second one adding
# CHAIN=/tmp/masr-device/chain_row FUSE_PAIRS="chain_row/amdr+chain/amass chain_row/mdr+chain/mass"
# The recipe with APR's ε = 2 (the default since 2026-11-29) ran on an H200 in the twenty-fifth
# session: TESTS_BESIDE=1 PARALLEL=1 TIME_LIMIT=250 CHAIN_ARGS="--patience 3" in 405 s, with
# DATA_SRC=.aotm/aotm2011.parquet: the CSV rewritten as zstd Parquet (3.1 MB; `masr prep` gives the
# same tables), because the CSV (5.7 MB) and the polars wheels (56 MB) together pass the call's 64 MiB
CHAIN_ARGS=${CHAIN_ARGS:-}
SPEED_SECONDS=6
if [ "${DRY:-0}" = 1 ]; then DEVICE=cpu TL=2 FULL_SAMPLE=300 SPEED_SECONDS=1; fi

stage environment
nvidia-smi -L 2>&1 | head -2
"$PY" - <<'EOF' 2>&1 | tee "$OUT/environment.txt"
import os, platform, torch, polars
print("python", platform.python_version(), "torch", torch.__version__, "polars", polars.__version__,
      "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-", "cpus", os.cpu_count())
EOF

stage "cuda tests (background) + prep"
cuda_tests() {
  (timeout 240 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/ >"$OUT/tests.txt" 2>&1) &
  TESTS=$!
}
TESTS=
if [ "${DRY:-0}" = 1 ] || [ "${SKIP_TESTS:-0}" = 1 ]; then
  echo "no CUDA tests this time" >"$OUT/tests.txt"
elif [ "${TESTS_BESIDE:-0}" != 1 ]; then
  cuda_tests
fi
if [ -f "$DATA/manifest.json" ]; then echo "reusing $DATA"
elif [ "${DRY:-0}" = 1 ]; then timeout 120 masr prep --out "$DATA" 2>&1 | tail -2
else timeout 120 masr prep "$DATA_SRC" --out "$DATA" 2>&1 | tail -2; fi
if [ -n "$TESTS" ]; then wait "$TESTS"; tail -3 "$OUT/tests.txt"; TESTS=; fi

if [ "${GRID:-0}" = 1 ]; then
  for model in mdr mass; do
    stage "$model: grid gpu, --time-limit $TL s per run"
    timeout $((10 * TL + 300)) "$PY" benchmarks/search_fullrank.py --data "$DATA" --model "$model" \
      --grid gpu --device "$DEVICE" --threads 0 --time-limit "$TL" \
      --runs "$WORK/grid" --out "$OUT/grid.jsonl" 2>&1 | tail -12
  done
fi

stage "training speed: paper vs fullrank recipe, one epoch each (extrapolated past ${SPEED_SECONDS} s)"
if [ "${DRY:-0}" != 1 ] && [ "${SKIP_SPEED:-0}" != 1 ]; then
  MASR_BENCH_DATA=$DATA timeout 120 "$PY" benchmarks/bench_train.py --skip-cpu \
    --models mdr,mass --batch-sizes default --max-seconds "$SPEED_SECONDS" \
    --recipes paper,fullrank 2>&1 | tail -6
  cp bench-out/train.json "$OUT/train_speed_recipes.json" 2>/dev/null
fi

if [ "${TESTS_BESIDE:-0}" = 1 ] && [ "${DRY:-0}" != 1 ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
  cuda_tests
fi
stage "amasr chain, fullrank recipe, --time-limit $TL s per run; item-kNN and pop beside it"
(timeout 200 masr train --model itemknn --set alpha=0.75 --set shrink=10 --data "$DATA" \
   --runs "$CHAIN" --device cpu >"$OUT/baselines.log" 2>&1 &&
 timeout 60 masr train --model pop --data "$DATA" --runs "$CHAIN" --device cpu \
   >>"$OUT/baselines.log" 2>&1) &
BASE=$!
CHAIN_OPTS=(--recipe fullrank --data "$DATA" --runs "$CHAIN" --device "$DEVICE" --time-limit "$TL")
if [ "${PARALLEL:-0}" = 1 ]; then
  # MDR beside MASS, then AMDR beside AMASS, on the one GPU (each pair shares it), then the
  # fusions, which retrain nothing: the same runs as one `masr train --model amasr`, in less
  # wall time, so that a run can go on to early stopping within one device call
  for pair in "mdr mass" "amdr amass"; do
    set -- $pair
    timeout $((TL + 150)) masr train --model "$1" "${CHAIN_OPTS[@]}" $CHAIN_ARGS >"$OUT/chain_$1.log" 2>&1 &
    timeout $((TL + 150)) masr train --model "$2" "${CHAIN_OPTS[@]}" $CHAIN_ARGS >"$OUT/chain_$2.log" 2>&1
    wait $!
    tail -n 4 "$OUT/chain_$1.log" "$OUT/chain_$2.log"
  done
fi
timeout $((5 * TL + 150)) masr train --model amasr "${CHAIN_OPTS[@]}" $CHAIN_ARGS >"$OUT/chain.log" 2>&1
tail -14 "$OUT/chain.log"
wait "$BASE"; tail -3 "$OUT/baselines.log"
for run in "$CHAIN"/*/; do
  [ -f "$run/run.json" ] && cp "$run/run.json" "$OUT/run_$(basename "$run").json"
done

if [ -n "$TESTS" ]; then wait "$TESTS"; echo "cuda tests:"; tail -3 "$OUT/tests.txt"; fi
stage "evaluate the chain, test split, $FULL_SAMPLE full-ranking cases"
timeout 150 masr evaluate --data "$DATA" --runs "$CHAIN" --device "$DEVICE" \
  --full-sample "$FULL_SAMPLE" --json "$OUT/evaluate_chain.json" 2>&1 | tail -14
for pair in ${FUSE_PAIRS:-}; do
  a=${pair%%+*} b=${pair##*+}
  stage "fusion of $a and $b (α 0.5): validation, then test on $FULL_SAMPLE full-ranking cases"
  for split in valid test; do
    n=$([ "$split" = valid ] && echo 2000 || echo "$FULL_SAMPLE")
    timeout 300 "$PY" benchmarks/fuse_checkpoints.py "$WORK/$a/best.pt" "$WORK/$b/best.pt" \
      --data "$DATA" --split "$split" --full-sample "$n" --device "$DEVICE" --threads 0 \
      | tee -a "$OUT/fuse_pairs.jsonl"
  done
done
stage done
