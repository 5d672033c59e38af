#!/usr/bin/env bash
# The GPU checks of one session on a lent GPU machine, in one pass (issues 3-5):
#   1. the CUDA tests, 2. training speed per epoch on AOTM (bench_train.py),
#   3. the AOTM chain (mdr, mass, amdr, amass -> masr, amasr) and GPU baselines under the same
#      per-run time budget, 4. `masr evaluate` on the test split, 5. export + score quality.
#
#   bash benchmarks/device_check.sh                    # from the repository root
#
# Environment: DATA_SRC (raw AOTM csv.gz; default ../shared/data/aotm2011.csv.gz; the device
# machine receives only the repository, so point DATA_SRC there at a file that travels), OUT
# (where results.tgz goes; default bench-out/device), WORK (scratch; default /tmp/masr-device),
# DEVICE (cuda), TIME_LIMIT (seconds per trained run; default 80), FULL_SAMPLE (full-ranking
# cases; default 5000), DRY=1 (embedded data, CPU, tiny budgets: a rehearsal of the script
# itself). Polars wheels in .whl/ are installed first when present (the GPU image has torch but
# no polars). Every stage is bounded by `timeout`, so one failure still leaves the others'
# results.
set -u
source "$(dirname "$0")/_device_env.sh"

DEVICE=${DEVICE:-cuda}
TL=${TIME_LIMIT:-80}
FULL_SAMPLE=${FULL_SAMPLE:-5000}
DATA_SRC=${DATA_SRC:-../shared/data/aotm2011.csv.gz}
RUNS=$WORK/runs
DATA=$WORK/data
BENCH_ARGS=(--skip-cpu --models mdr,mass --batch-sizes 1024,4096 --max-seconds 8 --dense-too)
if [ "${DRY:-0}" = 1 ]; then
  DEVICE=cpu TL=3 FULL_SAMPLE=500 DATA_SRC=""
  BENCH_ARGS=(--skip-cuda --cores 0 --models mdr --batch-sizes 1024 --max-seconds 2)
fi

stage environment
nvidia-smi -L 2>&1 | head -3
"$PY" - <<'EOF' 2>&1 | tee "$OUT/environment.txt"
import os, platform, torch, polars, onnxruntime as ort
print("python", platform.python_version(), "torch", torch.__version__, "polars", polars.__version__,
      "onnxruntime", ort.__version__, ort.get_available_providers())
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-",
      "cpus", os.cpu_count())
EOF

stage "cuda tests"
timeout 100 "$PY" -m pytest -q -x -p no:cacheprovider tests/test_train.py 2>&1 | tail -4 | tee "$OUT/tests.txt"

stage "prep $DATA_SRC"
if [ -n "$DATA_SRC" ]; then
  timeout 120 masr prep "$DATA_SRC" --out "$DATA" 2>&1 | tail -12
else
  timeout 120 masr prep --out "$DATA" 2>&1 | tail -12
fi
"$PY" -c "import json,sys; m=json.load(open(sys.argv[1])); print('fingerprint', m.get('fingerprint'))" \
  "$DATA/manifest.json" | tee "$OUT/fingerprint.txt"

stage "training speed"
if [ -n "$DATA_SRC" ]; then
  MASR_BENCH_DATA=$DATA_SRC timeout 200 "$PY" benchmarks/bench_train.py "${BENCH_ARGS[@]}" 2>&1 | tail -14
  cp bench-out/train.json "$OUT/train_speed.json" 2>/dev/null
fi

stage "train: chain parts and baselines side by side, --time-limit $TL s per run"
common=(--recipe paper --data "$DATA" --runs "$RUNS" --device "$DEVICE" --time-limit "$TL" --threads 2)
hard=$((2 * TL + 150))
timeout $hard masr train --model amdr "${common[@]}" >"$OUT/train_amdr.log" 2>&1 &
pids=($!)
timeout $hard masr train --model amass "${common[@]}" >"$OUT/train_amass.log" 2>&1 &
pids+=($!)
# baselines get the budget of a BPR run plus its APR run, as the proposed models
base=(--data "$DATA" --runs "$RUNS" --device "$DEVICE" --time-limit $((2 * TL)) --threads 2)
timeout $hard masr train --model mfbpr --entity user "${base[@]}" >"$OUT/train_mfbpr.log" 2>&1 &
pids+=($!)
timeout $hard masr train --model fism "${base[@]}" >"$OUT/train_fism.log" 2>&1 &
pids+=($!)
timeout $hard masr train --model cml --entity user "${base[@]}" >"$OUT/train_cml.log" 2>&1 &
pids+=($!)
wait "${pids[@]}"  # (a bare wait would also wait for the log's tee)
for f in "$OUT"/train_*.log; do echo "-- $f"; tail -3 "$f"; done
timeout 120 masr train --model amasr "${common[@]}" 2>&1 | tail -8
for m in pop itemknn "als --entity user"; do  # closed form / alternating: no time budget needed
  timeout 90 masr train --model $m --data "$DATA" --runs "$RUNS" --device "$DEVICE" 2>&1 | tail -2
done
for r in "$RUNS"/*/run.json; do cp "$r" "$OUT/run_$(basename "$(dirname "$r")").json"; done 2>/dev/null

stage "evaluate (test split; full ranking on $FULL_SAMPLE cases)"
ev=(--data "$DATA" --runs "$RUNS" --device "$DEVICE" --full-sample "$FULL_SAMPLE")
timeout 150 masr evaluate "${ev[@]}" --json "$OUT/evaluate_test_a.json" --model pop \
  --model itemknn --model als --model mfbpr --model cml --model fism --model mdr --model amdr \
  2>&1 | tail -24
timeout 200 masr evaluate "${ev[@]}" --json "$OUT/evaluate_test_b.json" --model mass \
  --model amass --model masr --model amasr 2>&1 | tail -14

stage "export + score quality"
timeout 60 masr export --runs "$RUNS" --out "$WORK/exported/masr.onnx" 2>&1 | tail -3
timeout 150 "$PY" benchmarks/bench_score.py --quality-runs "$RUNS" --quality-data "$DATA" \
  --quality-cases 1000 --cores 0 2>&1 | tail -12
cp bench-out/score_quality.json "$OUT/score_quality.json" 2>/dev/null
stage done
