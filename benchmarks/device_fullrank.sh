#!/usr/bin/env bash
# GPU pass for issue 11 (training for whole-catalog ranking): on AOTM's validation split only,
# MDR and MASS under the paper recipe and the fullrank recipe's variants (search_fullrank.py
# grid "gpu"), each run under the same --time-limit, then the whole AMASR chain under the
# fullrank recipe and `masr evaluate` with both protocols. Nothing here reads the test split
# except the final `masr evaluate` of the chain chosen beforehand.
#
#   bash benchmarks/device_fullrank.sh      # from the repository root; env as device_check.sh,
#                                           # plus TIME_LIMIT (s per run, default 60), GRID_ONLY
set -u
source "$(dirname "$0")/_device_env.sh"

DEVICE=${DEVICE:-cuda}
TL=${TIME_LIMIT:-60}
DATA_SRC=${DATA_SRC:-../shared/data/aotm2011.csv.gz}
DATA=$WORK/data
ONLY=${GRID_ONLY:-}
if [ "${DRY:-0}" = 1 ]; then DEVICE=cpu TL=2 ONLY="paper,fullrank"; fi

stage "prep"
if [ "${DRY:-0}" = 1 ]; then masr prep --out "$DATA" >/dev/null 2>&1
else timeout 120 masr prep "$DATA_SRC" --out "$DATA" 2>&1 | tail -3; fi

for model in mdr mass; do
  stage "$model: grid gpu, --time-limit $TL s per run"
  timeout $((10 * TL + 300)) "$PY" benchmarks/search_fullrank.py --data "$DATA" --model "$model" \
    --grid gpu ${ONLY:+--only "$ONLY"} --device "$DEVICE" --threads 0 --time-limit "$TL" \
    --runs "$WORK/grid" --out "$OUT/grid.jsonl" 2>&1 | tail -12
done

stage "amasr chain, fullrank recipe, --time-limit $TL s per run"
timeout $((5 * TL + 300)) masr train --model amasr --recipe fullrank --data "$DATA" \
  --runs "$WORK/chain" --device "$DEVICE" --time-limit "$TL" >"$OUT/chain.log" 2>&1
tail -14 "$OUT/chain.log"
timeout 240 masr evaluate --data "$DATA" --runs "$WORK/chain" --device "$DEVICE" \
  --full-sample 5000 --alpha 0.3 --alpha 0.7 --json "$OUT/evaluate_chain.json" 2>&1 | tail -12

stage "training speed: paper vs fullrank recipe"
if [ "${DRY:-0}" != 1 ]; then
  MASR_BENCH_DATA=$DATA_SRC timeout 150 "$PY" benchmarks/bench_train.py --skip-cpu \
    --models mdr,mass --batch-sizes default --max-seconds 10 --recipes paper,fullrank 2>&1 | tail -6
  cp bench-out/train.json "$OUT/train_speed_recipes.json" 2>/dev/null
fi
stage done
