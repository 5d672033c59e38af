"""masr export past protobuf's 2 GB: the weights in NAME.onnx.weights (ONNX external data),
forced here by a tiny ``PROTO_LIMIT``: same top-10 and scores as the one-file export and as
PyTorch, one --model path for masr score, and a weights file of another export refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from test_export import make_runs, playlist_rows, run
from typer.testing import CliRunner

from masr.checkpoint import load_model
from masr.dataset import load_prepared
from masr.errors import MasrError
from masr.export import ExportConfig, export_model, external, sidecar
from masr.models.base import Batch
from masr.score import ScoreConfig, score_file
from masr_cli.main import app

ROWS = "user_id,playlist_id,track_id\nu0,p0,s1\nu0,p0,s2\nu3,p7,s9\nu9,fresh,s40\n"


@pytest.fixture
def exports(tmp_path: Path, planted_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """(runs, one-file export, external-data export) of the same AMASR checkpoint."""
    runs = make_runs(tmp_path / "runs", planted_dir, ("amasr",))
    single = export_model(runs, tmp_path / "single" / "masr.onnx", ExportConfig(chunk=8)).path
    monkeypatch.setattr(external, "PROTO_LIMIT", 1000)  # "too large for one protobuf"
    monkeypatch.setattr(external, "MIN_EXTERNAL_BYTES", 64)  # the planted tables are small
    split = export_model(runs, tmp_path / "split" / "masr.onnx", ExportConfig(chunk=8)).path
    return runs, single, split


def test_a_model_past_the_limit_writes_its_weights_beside_it(exports) -> None:
    _, single, split = exports
    weights = sidecar(split, "weights")
    assert weights.name == "masr.onnx.weights" and weights.is_file()
    assert not sidecar(single, "weights").exists()
    meta = onnx.load(split, load_external_data=False)
    inside = external.tensor_bytes(meta)  # what stayed in the .onnx: scalars and axes
    assert inside < 1000 < external.tensor_bytes(onnx.load(single))
    stored = [t for t in meta.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert stored and {e.value for t in stored for e in t.external_data if e.key == "location"} == {
        "masr.onnx.weights"
    }  # relative to the model: the folder can move
    info = {p.key: p.value for p in meta.metadata_props}
    assert '"sha256"' in info["weights"] and info["export_id"] == next(
        p.value for p in onnx.load(single).metadata_props if p.key == "export_id"
    )
    assert sorted(p.name for p in split.parent.iterdir()) == sorted(
        p.name for p in single.parent.iterdir()
    ) + ["masr.onnx.weights"]  # nothing left aside


def test_same_top_10_as_the_one_file_export_and_as_pytorch(exports, planted_dir: Path) -> None:
    runs, single, split = exports
    data = load_prepared(planted_dir)
    rows, users, members = playlist_rows(data, 2)
    outs = []
    for path in (single, split):
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outs.append(run(sess, users, rows, members, 10))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])  # the same bytes, the same floats
    model, _ = load_model(runs / "amasr" / "best.pt")
    m = torch.from_numpy(members)
    batch = Batch(torch.from_numpy(users), torch.from_numpy(rows), m.clamp_min(0), m >= 0)
    with torch.no_grad():
        want = model.full_distance(batch).double()
    want[torch.arange(len(rows))[:, None].expand_as(m)[m >= 0], m[m >= 0]] = float("inf")
    assert (outs[1][0] == torch.topk(-want, 10).indices.numpy()).all()
    np.testing.assert_allclose(outs[1][1], -np.sort(want.numpy(), 1)[:, :10], rtol=1e-4, atol=1e-4)


def test_score_takes_the_one_model_path(exports, tmp_path: Path) -> None:
    _, single, split = exports
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    score_file(src, single, tmp_path / "a.csv", ScoreConfig(k=10))
    score_file(src, split, tmp_path / "b.csv", ScoreConfig(k=10))
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()


def test_a_weights_file_of_another_export_is_one_clear_error(exports, tmp_path: Path) -> None:
    _, _, split = exports
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    weights = sidecar(split, "weights")
    good = weights.read_bytes()
    changed = bytearray(good)
    changed[-1] ^= 0xFF  # same size: ONNX Runtime would load it
    weights.write_bytes(bytes(changed))
    with pytest.raises(MasrError, match=r"masr.onnx.weights: does not belong to masr.onnx"):
        score_file(src, split, tmp_path / "o.csv")
    weights.write_bytes(good[: len(good) // 2])
    with pytest.raises(MasrError, match=r"masr.onnx.weights: weights file missing or incomplete"):
        score_file(src, split, tmp_path / "o.csv")
    weights.unlink()
    with pytest.raises(MasrError, match=r"masr.onnx.weights: weights file missing or incomplete"):
        score_file(src, split, tmp_path / "o.csv")
    assert not (tmp_path / "o.csv").exists()


def test_cli_external_data_option_and_a_later_one_file_export(
    tmp_path: Path, planted_dir: Path
) -> None:
    runs = make_runs(tmp_path / "runs", planted_dir, ("mdr", "mass"))
    out = tmp_path / "exported" / "masr.onnx"
    runner = CliRunner()
    args = ["export", "--runs", str(runs), "--out", str(out)]
    result = runner.invoke(app, [*args, "--external-data"])
    assert result.exit_code == 0, result.stderr
    assert sidecar(out, "weights").is_file() and "masr.onnx.weights" in result.stderr
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    scored = runner.invoke(app, ["score", str(src), "--model", str(out)])
    assert scored.exit_code == 0, scored.stderr
    assert runner.invoke(app, args).exit_code == 0  # one file again: the old weights go
    assert not sidecar(out, "weights").exists()
    again = runner.invoke(app, ["score", str(src), "--model", str(out)])
    assert again.stdout == scored.stdout
    assert "--external-data" in runner.invoke(app, ["export", "--help"]).stdout


def test_a_failed_re_export_leaves_the_former_external_export_whole(
    exports, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weights file is staged with the model, its JSON and the id maps: an export that
    fails after writing new weights leaves the former export's weights, and it still scores."""
    import masr.export as export_module
    from masr.atomic import remove_temp_entries

    runs, _, split = exports
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    score_file(src, split, tmp_path / "before.csv", ScoreConfig(k=10))
    before = {p.name: p.read_bytes() for p in split.parent.iterdir()}

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_module.onnx, "save_model", fail)
    with pytest.raises(OSError):
        export_model(runs, split, ExportConfig(chunk=8, alpha=0.3))
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in split.parent.iterdir()} == before  # nothing aside
    score_file(src, split, tmp_path / "after.csv", ScoreConfig(k=10))
    assert (tmp_path / "after.csv").read_text() == (tmp_path / "before.csv").read_text()
    # a killed export's check folder is removed by the next export's clean-up
    (split.parent / ".masr.onnx.check.x1y2z3_4.tmp").mkdir()
    (split.parent / ".masr.onnx.check.x1y2z3_4.tmp" / "masr.onnx").write_bytes(b"x")
    (split.parent / ".masr.onnx.json.abcdefgh.tmp").write_bytes(b"x")
    removed = remove_temp_entries(split.parent, [split.name], sidecars=True)
    assert removed == 2 and sorted(p.name for p in split.parent.iterdir()) == \
        sorted(before)
