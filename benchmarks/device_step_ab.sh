#!/usr/bin/env bash
# GPU training speed of this version against an older one, on one card in one call (issue 13:
# "GPU epochs not slower than today's"): the paper recipe's epoch of MDR and MASS
# (bench_train.py, batch 1024), the two versions alternated twice, then what one step launches
# in each version (kernel_count.py: CUDA kernels, host-device copies and waits per step).
#
#   git archive d602c38 src benchmarks | (mkdir -p .old && tar -x -C .old)   # the old tree
#   bash benchmarks/device_step_ab.sh                  # from the repository root
#
# Environment: OLD (the old source tree, with its src/ and benchmarks/; default .old),
# DATA_SRC (AOTM as CSV, gzipped or not, or as Parquet; default
# ../shared/data/aotm2011.csv.gz): old versions prepare a CSV only, so other formats are
# written out as CSV first; OUT, WORK as in _device_env.sh; MAX_SECONDS (per timed epoch,
# default 8); DRY=1 (CPU, MDR only, 2 s epochs: a rehearsal of the script itself).
set -u
source "$(dirname "$0")/_device_env.sh"

OLD=${OLD:-.old}
DATA_SRC=${DATA_SRC:-../shared/data/aotm2011.csv.gz}
MAX_SECONDS=${MAX_SECONDS:-8}
WHERE=(--skip-cpu)
MODELS=mdr,mass
if [ "${DRY:-0}" = 1 ]; then
  WHERE=(--skip-cuda --cores 0) MODELS=mdr MAX_SECONDS=2
fi
if [ ! -f "$OLD/benchmarks/bench_train.py" ] || [ ! -d "$OLD/src/masr" ]; then
  echo "device_step_ab: no old tree at $OLD (git archive REV src benchmarks | tar -x -C $OLD)"
  exit 2
fi
OLD=$(cd "$OLD" && pwd)

stage environment
"$PY" - <<'EOF' 2>&1 | tee "$OUT/environment.txt"
import os, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda",
      torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-",
      "cpus", os.cpu_count())
EOF

stage "data: $DATA_SRC"
CSV=$DATA_SRC
case "$DATA_SRC" in
  *.csv|*.csv.gz) ;;
  *)
    CSV=$WORK/aotm.csv
    "$PY" -c "import polars as pl, sys; pl.read_parquet(sys.argv[1]).write_csv(sys.argv[2])" \
      "$DATA_SRC" "$CSV" || exit 1
    ;;
esac
CSV=$(cd "$(dirname "$CSV")" && pwd)/$(basename "$CSV")  # the benches run in their own trees
ls -l "$CSV"

version() {  # version old|new: its tree (ROOT), PYTHONPATH (VPATH) and recipe flag (EXTRA)
  if [ "$1" = old ]; then
    ROOT=$OLD VPATH=$OLD/src:$PYTHONPATH EXTRA=()  # versions before --recipes trained the paper's
  else
    ROOT=$PWD VPATH=$PYTHONPATH EXTRA=(--recipes paper)
  fi
}

bench() {  # bench VERSION ROUND: one paper-recipe epoch of each model, as that version times it
  version "$1"
  (cd "$ROOT" && PYTHONPATH=$VPATH MASR_BENCH_DATA=$CSV timeout 300 "$PY" benchmarks/bench_train.py \
    "${WHERE[@]}" --models "$MODELS" --batch-sizes default --max-seconds "$MAX_SECONDS" \
    "${EXTRA[@]}" 2>&1 | grep -v "^ *\[" | tail -6)
  cp "$ROOT/bench-out/train.json" "$OUT/train-$1-$2.json" 2>/dev/null
}

for round in 1 2; do
  for v in old new; do
    stage "epoch, $v version, round $round"
    bench "$v" "$round"
  done
done

for v in old new; do
  stage "what one MDR step launches, $v version"
  version "$v"
  (cd "$ROOT" && PYTHONPATH=$VPATH MASR_BENCH_DATA=$CSV timeout 300 "$PY" \
    "$OLDPWD/benchmarks/kernel_count.py" --json "$OUT/kernels-$v.json" -- \
    benchmarks/bench_train.py "${WHERE[@]}" --models mdr --batch-sizes default --max-seconds 3 \
    "${EXTRA[@]}" 2>&1 | grep -v "^ *\[" | grep -A14 '"per_step"')
done

stage "done"
"$PY" - "$OUT" <<'EOF' 2>&1 | tee "$OUT/summary.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("train-*.json")):
    rows = json.loads(f.read_text())
    rows = rows.get("results", rows) if isinstance(rows, dict) else rows
    for r in rows if isinstance(rows, list) else []:
        print(f.stem, r.get("model"), r.get("device"), r.get("recipe", "paper"),
              r.get("batch_size"), r.get("seconds_per_epoch"))
for f in sorted(out.glob("kernels-*.json")):
    print(f.stem, json.dumps(json.loads(f.read_text()).get("per_step")))
EOF
