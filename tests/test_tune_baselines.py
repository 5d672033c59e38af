"""benchmarks/tune_baselines.py: a closed-form baseline's grid, chosen on validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_the_best_point_is_chosen_by_the_selected_protocol(
    planted_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--full --select full chooses by validation full hit@10 on --full-sample cases (what
    masr's own models are chosen by under the default recipe); --select full alone is refused."""
    from conftest import load_benchmark

    tune = load_benchmark("tune_baselines")
    grid = ["--grid", "alpha=0.5,1", "--grid", "shrink=0,50"]
    assert tune.main(["--data", str(planted_dir), "--model", "itemknn", *grid, "--full",
                      "--full-sample", "30", "--select", "full"]) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 4 and all("valid_full_hit@10" in r for r in rows)
    top = max(r["valid_full_hit@10"] for r in rows)
    chosen = [r for r in rows if r["valid_full_hit@10"] == top]
    assert "best on validation (full)" in err
    assert any(f"hit@10 {top:.4f}" in err and f"'shrink': {r['shrink']}" in err for r in chosen)
    with pytest.raises(SystemExit):
        tune.main(["--data", str(planted_dir), "--model", "itemknn", *grid, "--select", "full"])
