# Shared start of the device_*.sh scripts (sourced): results folder packed into $OUT/results.tgz
# (the device returns at most 8 files; packed at each stage and every 30 s), polars wheels from
# .whl/, a `masr` command on PATH.
DEST=${OUT:-bench-out/device}
WORK=${WORK:-/tmp/masr-device}
OUT=$WORK/results  # everything lands here; pack() copies it to $DEST as one results.tgz
mkdir -p "$DEST" "$OUT"
pack() { tar -czf "$DEST/.results.tgz" -C "$OUT" . && mv "$DEST/.results.tgz" "$DEST/results.tgz"; }
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
if [ "${DRY:-0}" != 1 ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}
mkdir -p "$WORK/bin"
printf '#!/bin/sh\nexec "%s" -m masr_cli.main "$@"\n' "$(command -v "$PY")" >"$WORK/bin/masr"
chmod +x "$WORK/bin/masr"
export PATH=$WORK/bin:$PATH
stage() { pack; echo "== $(date +%T) $*"; }
# pack every 30 s as well, so that a call cut by its time limit still returns the logs so far
# (each pack replaces results.tgz whole: write aside, then rename)
if [ "${DRY:-0}" != 1 ]; then
  (while sleep 30 && kill -0 $$ 2>/dev/null; do pack; done) >/dev/null 2>&1 &
  PACKER=$!
  trap 'kill "$PACKER" 2>/dev/null; pack' EXIT
fi
