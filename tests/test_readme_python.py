"""The README's "From Python" block runs as written: only the epochs and the embedded dataset's
size are cut, so that the library calls, their names and their arguments are the ones tested."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## From Python", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "README.md: no python block under ## From Python"
    return found.group(1)


def test_the_readme_python_block_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import masr.runs

    code = _block()
    small = 'prepare(None, "data", synth_users=120)'
    assert 'prepare(None, "data")' in code
    code = code.replace('prepare(None, "data")', small)
    real = masr.runs.train_run

    def one_epoch(name, data, runs_dir, options, **kwargs):  # noqa: ANN001, ANN003, ANN202
        options = dataclasses.replace(
            options,
            train=dataclasses.replace(options.train, epochs=1),
            adversarial=dataclasses.replace(options.adversarial, epochs=1),
        )
        return real(name, data, runs_dir, options, **kwargs)

    monkeypatch.setattr(masr.runs, "train_run", one_epoch)
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "playlists.csv", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md (From Python)", "exec"), {})
    out = capsys.readouterr().out
    assert "'sampled': {'hit@1'" in out and "'full': {'hit@1'" in out
    assert "ScoreSummary(playlists=3" in out
    recs = (tmp_path / "recs.csv").read_text().splitlines()
    assert recs[0] == "playlist_id,rank,track_id,score" and len(recs) == 1 + 3 * 10
    assert {p.name for p in (tmp_path / "runs").iterdir()} >= {"mdr", "mass", "amasr"}
