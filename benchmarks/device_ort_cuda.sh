#!/usr/bin/env bash
# ONNX Runtime's CUDA provider on a lent GPU (issue 4): throughput of the exported AOTM-sized graph
# against ONNX Runtime on CPU and PyTorch eager (CPU and CUDA) on the same playlists, their parity,
# and `masr score --device cuda` through the CLI with torch made unimportable.
#
# The GPU image carries only the CPU `onnxruntime`; the onnxruntime-gpu wheel (~255 MB) is larger
# than one device call may carry (64 MiB). So it travels unpacked and xz-compressed in parts over
# successive calls to the same warm machine, each copied to $ORT_PARTS, and is joined here:
#   (here)   pip download --no-deps --only-binary=:all: --python-version 3.12 ... onnxruntime-gpu
#            unzip the wheel into x/; tar -cf - -C x . | xz -6 | split -n 4 -d - part.
#            put part.0N into the ignored folder .ort(N+1)/
#   (device) one call per part:  mkdir -p /tmp/ortparts && cp .ortN/part.* /tmp/ortparts/
#   (device) the last call:      bash benchmarks/device_ort_cuda.sh
# ORT_SHA256 checks the joined archive. The unpacked wheel goes first on PYTHONPATH, with a link to
# the image's nvidia/ wheels beside it, as `pip install onnxruntime-gpu` next to them would lay it
# out (ONNX Runtime's preload_dlls() looks for nvidia/cu13/lib beside its own package).
# CHECK: a folder with an exported embedded model (masr.onnx + side files; optionally the same
# exported with --chunk 4096 as masr-c4096.onnx), examples.csv and bulk.csv[.gz] (inputs in the
# `masr prep` format). Results: $OUT/results.tgz (see _device_env.sh).
set -uo pipefail
source "$(dirname "$0")/_device_env.sh"
ORT_PARTS=${ORT_PARTS:-/tmp/ortparts}
ORT_SITE=${ORT_SITE:-/tmp/ortsite}
CHECK=${CHECK:-.ortcheck}
DEV=${DEV:-cuda} TORCH_DEVICES=${TORCH_DEVICES:-cpu,cuda} N=${N:-8192}  # DRY=1 rehearsal: cpu, cpu

stage "join the onnxruntime-gpu parts"
mkdir -p "$ORT_PARTS"
cp .ort*/part.* "$ORT_PARTS/" 2>/dev/null
ls -la "$ORT_PARTS"
if [ ! -d "$ORT_SITE/onnxruntime" ]; then
  cat "$ORT_PARTS"/part.* >/tmp/ort.tar.xz
  sha256sum /tmp/ort.tar.xz
  if [ -n "${ORT_SHA256:-}" ] && ! echo "$ORT_SHA256  /tmp/ort.tar.xz" | sha256sum -c -; then
    echo "joined archive does not match ORT_SHA256"; pack; exit 1
  fi
  mkdir -p "$ORT_SITE" && tar -xJf /tmp/ort.tar.xz -C "$ORT_SITE" || { pack; exit 1; }
fi
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -e "$ORT_SITE/nvidia" ] || ln -s "$SITE/nvidia" "$ORT_SITE/nvidia"
ls "$SITE/nvidia" "$SITE/nvidia/cu13/lib" 2>&1 | head -40
export PYTHONPATH=$ORT_SITE:$PYTHONPATH
nvidia-smi -L
"$PY" -c 'import onnxruntime as o; print(o.__version__, o.__file__, o.get_available_providers())'

stage "bench_score: ONNX Runtime CUDA vs CPU vs PyTorch eager CPU/CUDA (random AOTM-sized model)"
# export chunks (CHUNKS; 256 is the CPU-tuned default) at BATCHES playlists per call; PyTorch on
# CPU (slow) only with the first pair
first=1
for chunk in ${CHUNKS:-256 4096 16384 65536}; do
  for bs in ${BATCHES:-512}; do
    torch=$TORCH_DEVICES; [ $first = 1 ] || torch=${TORCH_DEVICES#cpu,}; first=0
    "$PY" benchmarks/bench_score.py --device "$DEV" --cores 16 --playlists "$N" --batch-size "$bs" \
      --chunk "$chunk" --repeat 3 --torch-playlists $((N / 4)) --torch-device "$torch"
    cp bench-out/score.json "$OUT/score_${DEV}_c${chunk}_b$bs.json"
  done
done
if [ "${CPU16:-1}" = 1 ]; then
  "$PY" benchmarks/bench_score.py --device cpu --cores 16 --playlists "$N" --repeat 2 --skip-torch
  cp bench-out/score.json "$OUT/score_cpu16.json"
fi

stage "masr score --device cuda through the CLI, torch unimportable"
noTorch() {  # the CLI with `import torch` failing: the scoring install has no PyTorch
  "$PY" -c 'import sys; sys.modules["torch"] = None; sys.argv[0] = "masr"
from masr_cli.main import app; app()' "$@"
}
BULK=$(ls "$CHECK"/bulk.csv* | head -1)  # bulk.csv or bulk.csv.gz
# CHECK/masr.onnx (chunk 256) on DEV and CPU; CHECK/masr-c4096.onnx (chunk 4096) on DEV
for run in "$DEV masr" "cpu masr" "$DEV masr-c4096"; do
  set -- $run
  [ -f "$CHECK/$2.onnx" ] || continue
  noTorch score "$CHECK/examples.csv" --model "$CHECK/$2.onnx" --device "$1" >"$OUT/examples_$1_$2.csv"
  echo "rc=$?"
  start=$EPOCHREALTIME
  noTorch score "$BULK" --model "$CHECK/$2.onnx" --device "$1" --out "$OUT/bulk_$1_$2.csv"
  rc=$?
  awk -v a="$start" -v b="$EPOCHREALTIME" -v d="$1 $2" -v rc=$rc \
    'BEGIN { printf "rc=%d bulk on %s: %.2f s wall, process start included\n", rc, d, b - a }'
done
"$PY" - "$OUT" "$DEV" <<'EOF'
import sys
from pathlib import Path

import numpy as np
import polars as pl

out, dev = Path(sys.argv[1]), sys.argv[2]
for name in ("examples", "bulk"):
    cpu = pl.read_csv(out / f"{name}_cpu_masr.csv", infer_schema=False)
    for model in ("masr", "masr-c4096"):
        if not (out / f"{name}_{dev}_{model}.csv").exists():
            continue
        other = pl.read_csv(out / f"{name}_{dev}_{model}.csv", infer_schema=False)
        both = other.join(cpu, on=["playlist_id", "rank"], suffix="_cpu")
        same = both.group_by("playlist_id").agg(
            (pl.col("track_id") == pl.col("track_id_cpu")).all()
        )
        diff = np.abs(both["score"].cast(float) - both["score_cpu"].cast(float)).max()
        print(
            f"{name}, {model} on {dev} vs masr on cpu: {other.height} rows (cpu {cpu.height}), "
            f"{same.height} playlists, same top-K {same['track_id'].mean():.4f}, "
            f"max |score diff| {diff:.2e}"
        )
EOF
stage "done"
pack
