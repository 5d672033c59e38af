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
# CHECK: a folder with an exported embedded model (masr.onnx + side files), examples.csv and
# bulk.csv (inputs in the `masr prep` format). Results: $OUT/results.tgz (see _device_env.sh).
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
for bs in 512 2048; do
  "$PY" benchmarks/bench_score.py --device "$DEV" --cores 16 --playlists "$N" --batch-size "$bs" \
    --repeat 3 --torch-playlists $((N / 4)) --torch-device "$TORCH_DEVICES"
  cp bench-out/score.json "$OUT/score_${DEV}_b$bs.json"
done
"$PY" benchmarks/bench_score.py --device cpu --cores 16 --playlists "$N" --repeat 2 --skip-torch
cp bench-out/score.json "$OUT/score_cpu16.json"

stage "masr score --device cuda through the CLI, torch unimportable"
noTorch() {  # the CLI with `import torch` failing: the scoring install has no PyTorch
  "$PY" -c 'import sys; sys.modules["torch"] = None; sys.argv[0] = "masr"
from masr_cli.main import app; app()' "$@"
}
for dev in "$DEV" cpu; do
  noTorch score "$CHECK/examples.csv" --model "$CHECK/masr.onnx" --device "$dev" \
    >"$OUT/examples_$dev.csv"
  echo "rc=$?"
  start=$EPOCHREALTIME
  noTorch score "$CHECK/bulk.csv" --model "$CHECK/masr.onnx" --device "$dev" --out "$OUT/bulk_$dev.csv"
  rc=$?
  awk -v a="$start" -v b="$EPOCHREALTIME" -v d="$dev" -v rc=$rc \
    'BEGIN { printf "rc=%d bulk on %s: %.2f s wall, process start included\n", rc, d, b - a }'
done
"$PY" - "$OUT" "$DEV" <<'EOF'
import sys
from pathlib import Path

import numpy as np
import polars as pl

out = Path(sys.argv[1])
for name in ("examples", "bulk"):
    cuda = pl.read_csv(out / f"{name}_{sys.argv[2]}.csv", infer_schema=False)
    cpu = pl.read_csv(out / f"{name}_cpu.csv", infer_schema=False)
    both = cuda.join(cpu, on=["playlist_id", "rank"], suffix="_cpu")
    same = both.group_by("playlist_id").agg((pl.col("track_id") == pl.col("track_id_cpu")).all())
    diff = np.abs(both["score"].cast(float) - both["score_cpu"].cast(float)).max()
    print(f"{name}: {cuda.height} rows (cpu {cpu.height}), {same.height} playlists, same top-K "
          f"{same['track_id'].mean():.4f}, max |score diff| {diff:.2e}")
EOF
stage "done"
pack
