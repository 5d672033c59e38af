#!/usr/bin/env bash
# Second GPU pass (after device_check.sh): the AMASR chain at batch 4096, one chain per shared
# learning rate, each run under the same --time-limit, then `masr evaluate`, then the training
# speed at batch 8192. The learning rate is chosen on the validation hit@10 of the fused amasr
# run (run.json), never on test.
#
#   bash benchmarks/device_search.sh        # from the repository root; env as device_check.sh,
#                                           # plus LRS (default "0.003 0.01"), BATCH (4096)
set -u
source "$(dirname "$0")/_device_env.sh"

DEVICE=${DEVICE:-cuda}
TL=${TIME_LIMIT:-35}
BATCH=${BATCH:-4096}
LRS=${LRS:-0.003 0.01}
DATA_SRC=${DATA_SRC:-../shared/data/aotm2011.csv.gz}
DATA=$WORK/data
if [ "${DRY:-0}" = 1 ]; then DEVICE=cpu TL=3 BATCH=1024 LRS="0.003"; fi

stage "prep"
if [ "${DRY:-0}" = 1 ]; then masr prep --out "$DATA" >/dev/null 2>&1
else timeout 120 masr prep "$DATA_SRC" --out "$DATA" 2>&1 | tail -3; fi

for lr in $LRS; do
  runs=$WORK/runs_b${BATCH}_lr$lr
  stage "chain: batch $BATCH, lr $lr, --time-limit $TL s per run"
  timeout $((5 * TL + 120)) masr train --model amasr --data "$DATA" --runs "$runs" \
    --recipe paper --device "$DEVICE" --batch-size "$BATCH" --lr "$lr" --time-limit "$TL" \
    >"$OUT/chain_lr$lr.log" 2>&1
  tail -12 "$OUT/chain_lr$lr.log"
  mkdir -p "$OUT/lr$lr"
  for r in "$runs"/*/run.json; do cp "$r" "$OUT/lr$lr/$(basename "$(dirname "$r")").json"; done
  timeout 90 masr evaluate --data "$DATA" --runs "$runs" --device "$DEVICE" --full-sample 5000 \
    --json "$OUT/evaluate_lr$lr.json" 2>&1 | tail -10
done

stage "training speed at batch 8192"
if [ "${DRY:-0}" != 1 ]; then
  MASR_BENCH_DATA=$DATA_SRC timeout 90 "$PY" benchmarks/bench_train.py --skip-cpu \
    --models mdr,mass --batch-sizes 8192 --max-seconds 8 --dense-too 2>&1 | tail -5
  cp bench-out/train.json "$OUT/train_speed_8192.json" 2>/dev/null
fi
stage done
