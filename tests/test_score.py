"""masr.score: streaming bulk scoring with ONNX Runtime (output format, counts, chunking, errors,
no torch on the import path)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from masr.errors import MasrError
from masr.io import Columns
from masr.score import ExportedModel, ScoreConfig, grid_cells, plan_batches, score_file


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An AMASR export of random-weight checkpoints on the planted data (48 songs s0..s47,
    users u0..u11, playlists p0..p35)."""
    import torch
    from conftest import write_planted

    from masr.checkpoint import save_checkpoint
    from masr.dataset import load_prepared
    from masr.export import ExportConfig, export_model
    from masr.models.mass import MASS, MASSConfig
    from masr.models.mdr import MDR, MDRConfig

    root = tmp_path_factory.mktemp("scoring")
    data_dir = write_planted(root / "data")
    data = load_prepared(data_dir)
    torch.manual_seed(0)
    sizes = (data.n_users, data.n_playlists, data.n_songs)
    for run, model in (
        ("amdr", MDR(MDRConfig(dim=8), *sizes)),
        ("amass", MASS(MASSConfig(dim=8, query_init="default"), *sizes)),
    ):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.3 * torch.randn_like(p))
        (root / "runs" / run).mkdir(parents=True)
        save_checkpoint(root / "runs" / run / "best.pt", model, data_fingerprint=data.fingerprint)
        info = {"data": {"path": str(data_dir), "fingerprint": data.fingerprint}}
        (root / "runs" / run / "run.json").write_text(json.dumps(info))
    out = root / "exported" / "masr.onnx"
    export_model(root / "runs", out, ExportConfig(chunk=16))
    return out


def write_csv(
    path: Path, rows: list[tuple[str, str, str]], header: str = "user_id,playlist_id,track_id"
) -> Path:
    path.write_text(header + "\n" + "".join(",".join(r) + "\n" for r in rows))
    return path


ROWS = [
    ("u0", "p0", "s1"),
    ("u0", "p0", "s2"),
    ("u0", "p0", "nope"),  # unknown song: ignored, counted
    ("u0", "p0", "s2"),  # duplicate: ignored, counted
    ("u9", "fresh", "s40"),  # new playlist of a known user: folded in
    ("u9", "fresh", "s41"),
    ("newbie", "solo", "s7"),  # new user, new playlist
    ("u3", "empty", "zzz"),  # no usable member: fallback
]


def read_out(path: Path) -> pl.DataFrame:
    return pl.read_csv(path, schema_overrides={"playlist_id": pl.String, "track_id": pl.String})


def test_output_format_order_and_counts(tmp_path: Path, exported: Path) -> None:
    src = write_csv(tmp_path / "in.csv", ROWS)
    out = tmp_path / "recs.csv"
    summary = score_file(src, exported, out, ScoreConfig(k=5))
    assert out.read_text().splitlines()[0] == "playlist_id,rank,track_id,score"
    recs = read_out(out)
    assert recs["playlist_id"].unique(maintain_order=True).to_list() == [
        "p0",
        "fresh",
        "solo",
        "empty",
    ]
    assert recs["rank"].to_list() == [1, 2, 3, 4, 5] * 4
    for pid, group in recs.group_by("playlist_id"):
        scores = group["score"].to_numpy()
        assert (np.diff(scores) <= 0).all()  # rank 1 best, higher is better
        own = {t for u, p, t in ROWS if p == pid[0]}
        assert not own & set(group["track_id"].to_list())  # members never recommended
        assert set(group["track_id"].to_list()) <= {f"s{i}" for i in range(48)}
    assert (summary.playlists, summary.rows) == (4, 8)
    assert (summary.unknown_song_rows, summary.duplicate_rows) == (2, 1)
    assert (summary.new_playlists, summary.new_user_playlists) == (3, 1)
    assert summary.fallback_playlists == 1 and summary.provider == "cpu"
    assert "4 playlists" in summary.line()


def test_scores_equal_a_direct_call_of_the_graph(tmp_path: Path, exported: Path) -> None:
    """Ids map to the right indices: the CSV equals the graph run on hand-mapped indices."""
    src = write_csv(tmp_path / "in.csv", ROWS[:2] + ROWS[4:6])
    score_file(src, exported, tmp_path / "o.csv", ScoreConfig(k=4))
    recs = read_out(tmp_path / "o.csv")
    model = ExportedModel(exported, "cpu")
    songs, scores = model.top_k(
        np.array([0, 9]), np.array([0, -1]), np.array([[1, 2], [40, 41]]), 4
    )
    assert recs["track_id"].to_list() == [f"s{i}" for i in songs.reshape(-1)]
    np.testing.assert_allclose(recs["score"].to_numpy(), scores.reshape(-1), rtol=1e-6)


def test_chunked_reading_gives_the_same_output(tmp_path: Path, exported: Path) -> None:
    rows = [(f"u{i % 12}", f"p{i}", f"s{(i * 7 + j) % 48}") for i in range(36) for j in range(4)]
    src = write_csv(tmp_path / "in.csv", rows)
    whole, chunked = tmp_path / "a.csv", tmp_path / "b.csv"
    score_file(src, exported, whole, ScoreConfig(k=3))
    score_file(src, exported, chunked, ScoreConfig(k=3, read_rows=5, batch_size=4, workers=2))
    assert whole.read_text() == chunked.read_text()


@pytest.mark.parametrize("write_rows", [1, 7, 1 << 18])
def test_output_written_in_slices_is_the_same(
    tmp_path: Path, exported: Path, monkeypatch: pytest.MonkeyPatch, write_rows: int
) -> None:
    """A read chunk's rows are written WRITE_ROWS at a time (QA: its whole output as one frame
    held 1.1 GB at --k 749 for 25,000 playlists), with the same bytes: a slice of one playlist
    (k above WRITE_ROWS), of several, or the whole chunk; with the catalog's 48 songs short of
    the k asked for too."""
    import masr.score

    rows = [(f"u{i % 12}", f"p{i}", f"s{(i * 7 + j) % 48}") for i in range(36) for j in range(4)]
    src = write_csv(tmp_path / "in.csv", rows)
    for k in (3, 60):
        whole, sliced = tmp_path / f"a{k}.csv", tmp_path / f"b{k}.csv"
        score_file(src, exported, whole, ScoreConfig(k=k))
        monkeypatch.setattr(masr.score, "WRITE_ROWS", write_rows)
        score_file(src, exported, sliced, ScoreConfig(k=k))
        monkeypatch.undo()
        assert sliced.read_bytes() == whole.read_bytes()
        assert read_out(sliced).height == 36 * min(k, 48 - 4)


def test_standard_input_and_a_named_pipe_score_as_the_file(
    tmp_path: Path, exported: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """score_file reads ``-`` and a named pipe itself (spooled: the reader scans its input
    twice), as the CLI does, with the file's output."""
    import io
    import os
    import sys
    import threading

    src = write_csv(tmp_path / "in.csv", ROWS)
    expected = tmp_path / "file.csv"
    score_file(src, exported, expected, ScoreConfig(k=3))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(src.read_bytes())))
    score_file("-", exported, tmp_path / "stdin.csv", ScoreConfig(k=3))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(src.read_bytes()), daemon=True)
    writer.start()
    score_file(fifo, exported, tmp_path / "pipe.csv", ScoreConfig(k=3))
    writer.join(timeout=60)
    for got in ("stdin.csv", "pipe.csv"):
        assert (tmp_path / got).read_text() == expected.read_text()


def test_playlists_scattered_across_read_chunks_are_regrouped(
    tmp_path: Path, exported: Path
) -> None:
    """Rows in no particular order (a database export), within one read chunk or across
    chunks: the input is regrouped in memory, playlists in the order of their first row, with
    the same recommendations as the grouped file and a note in the summary line."""
    rows = [("u0", "p0", "s1"), ("u1", "p1", "s5"), ("u0", "p0", "s2"), ("u1", "p1", "s6"),
            ("u2", "p2", "s9"), ("u0", "p0", "s3")]
    src = write_csv(tmp_path / "in.csv", rows)
    one = score_file(src, exported, tmp_path / "one.csv", ScoreConfig(k=2))
    assert one.playlists == 3 and one.regrouped
    scattered = score_file(src, exported, tmp_path / "chunks.csv", ScoreConfig(k=2, read_rows=2))
    assert scattered.playlists == 3 and scattered.regrouped
    assert "regrouped by playlist in memory" in scattered.line()
    assert (tmp_path / "chunks.csv").read_text() == (tmp_path / "one.csv").read_text()
    grouped = write_csv(tmp_path / "grouped.csv", sorted(rows, key=lambda r: r[1]))
    adjacent = score_file(grouped, exported, tmp_path / "g.csv", ScoreConfig(k=2, read_rows=2))
    assert not adjacent.regrouped  # streamed
    # p0, p1, p2: the order of their first rows, as the regrouped input has them
    assert (tmp_path / "g.csv").read_text() == (tmp_path / "chunks.csv").read_text()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), max_size=8), max_size=12))
def test_playlists_met_before_are_told_chunk_by_chunk(chunks: list[list[int]]) -> None:
    """``_seen`` / ``_with`` (the adjacency checks' record of the playlists met so far, kept
    sorted and searched instead of a set union of everything at each chunk; QA: that took 14 of
    47 s on 400,000 playlists): a playlist is "again" exactly when an earlier chunk had it."""
    from masr.score import _seen, _with

    done = np.empty(0, dtype=np.uint64)
    met: set[str] = set()
    for chunk in chunks:
        ids = pl.Series([f"p{i:03d}" for i in chunk], dtype=pl.String)
        distinct, hashes, again = _seen(ids, done)
        assert dict(zip(distinct.to_list(), again.tolist(), strict=True)) == {
            pid: pid in met for pid in distinct.to_list()}
        done = _with(done, hashes)
        assert (np.diff(done.astype(np.float64)) >= 0).all()
        met |= set(distinct.to_list())


def test_a_playlist_met_again_many_chunks_later_is_regrouped(
    tmp_path: Path, exported: Path
) -> None:
    """Thirty playlists in grouped chunks of two rows, then the first one again at the end:
    the streamed check sees the repeat across chunks and the input is regrouped."""
    rows = [(f"u{i % 12}", f"p{i}", f"s{i}") for i in range(30)] + [("u0", "p0", "s40")]
    src = write_csv(tmp_path / "in.csv", rows)
    late = score_file(src, exported, tmp_path / "o.csv", ScoreConfig(k=2, read_rows=2))
    assert late.playlists == 30 and late.regrouped
    head = write_csv(tmp_path / "head.csv", rows[:30])
    streamed = score_file(head, exported, tmp_path / "g.csv", ScoreConfig(k=2, read_rows=2))
    assert streamed.playlists == 30 and not streamed.regrouped


@pytest.mark.parametrize("kind", ["tsv", "csv.gz", "parquet"])
def test_other_input_formats_and_column_names(tmp_path: Path, exported: Path, kind: str) -> None:
    frame = pl.DataFrame({"owner": ["u0", "u0"], "pid": ["p0", "p0"], "uri": ["s1", "s2"]})
    path = tmp_path / f"in.{kind}"
    if kind == "tsv":
        frame.write_csv(path, separator="\t")
    elif kind == "csv.gz":
        path.write_bytes(gzip.compress(frame.write_csv().encode()))
    else:
        frame.write_parquet(path)
    columns = Columns(user="owner", playlist="pid", track="uri")
    summary = score_file(path, exported, tmp_path / "o.csv", ScoreConfig(k=3, columns=columns))
    assert summary.playlists == 1 and read_out(tmp_path / "o.csv").height == 3


def test_semicolon_csv_with_a_spreadsheet_header_scores_as_the_plain_csv(
    tmp_path: Path, exported: Path
) -> None:
    rows = [("u0", "p0", "s1"), ("u0", "p0", "s2"), ("u1", "p1", "s5")]
    path = tmp_path / "excel.csv"
    path.write_text("\n".join(["User_ID;Playlist_ID;Track_ID", *(";".join(r) for r in rows)]))
    score_file(path, exported, tmp_path / "o.csv", ScoreConfig(k=3))
    plain = write_csv(tmp_path / "plain.csv", rows)
    score_file(plain, exported, tmp_path / "p.csv", ScoreConfig(k=3))
    assert (tmp_path / "o.csv").read_text() == (tmp_path / "p.csv").read_text()
    assert read_out(tmp_path / "o.csv").height == 6


def test_a_directory_of_parquet_parts_scores_as_the_csv(tmp_path: Path, exported: Path) -> None:
    rows = [("u0", "p0", "s1"), ("u0", "p0", "s2"), ("u1", "p1", "s5"), ("u1", "p2", "s7")]
    frame = pl.DataFrame(rows, schema=["user_id", "playlist_id", "track_id"], orient="row")
    parts = tmp_path / "parts"
    parts.mkdir()
    frame.slice(0, 3).write_parquet(parts / "part-00000.parquet")
    frame.slice(3, 1).write_parquet(parts / "part-00001.parquet")
    (parts / "_SUCCESS").write_text("")
    score_file(parts, exported, tmp_path / "o.csv", ScoreConfig(k=3, read_rows=2))
    score_file(write_csv(tmp_path / "in.csv", rows), exported, tmp_path / "p.csv", ScoreConfig(k=3))
    assert (tmp_path / "o.csv").read_text() == (tmp_path / "p.csv").read_text()


def test_a_list_column_of_tracks_scores_as_one_row_per_song(
    tmp_path: Path, exported: Path
) -> None:
    rows = [("u0", "p0", "s1"), ("u0", "p0", "s2"), ("u1", "p1", "s5")]
    lists = pl.DataFrame(
        {"user_id": ["u0", "u1"], "playlist_id": ["p0", "p1"], "track_id": [["s1", "s2"], ["s5"]]}
    )
    lists.write_parquet(tmp_path / "lists.parquet")
    score_file(tmp_path / "lists.parquet", exported, tmp_path / "o.csv", ScoreConfig(k=3))
    score_file(write_csv(tmp_path / "in.csv", rows), exported, tmp_path / "p.csv", ScoreConfig(k=3))
    assert (tmp_path / "o.csv").read_text() == (tmp_path / "p.csv").read_text()


def test_mpd_json_challenge_playlists_without_tracks_are_continued_too(
    tmp_path: Path, exported: Path
) -> None:
    """The MPD challenge set's layout: title-only playlists (no tracks) get recommendations
    (popularity), in the file's order of playlists, and are not counted as unknown songs."""
    import json

    playlists = [
        {"pid": 7, "tracks": [{"pos": 0, "track_uri": "s1"}, {"pos": 1, "track_uri": "s2"}]},
        {"pid": 8, "tracks": []},
        {"pid": 9, "tracks": [{"pos": 0, "track_uri": "s5"}]},
    ]
    path = tmp_path / "challenge_set.json"
    path.write_text(json.dumps({"date": "x", "playlists": playlists}))
    summary = score_file(path, exported, tmp_path / "o.csv", ScoreConfig(k=3))
    recs = read_out(tmp_path / "o.csv")
    assert recs["playlist_id"].unique(maintain_order=True).to_list() == ["7", "8", "9"]
    assert summary.playlists == 3 and summary.fallback_playlists == 1
    assert summary.unknown_song_rows == 0 and recs.height == 9


def test_text_that_is_not_utf8_names_the_conversion(tmp_path: Path, exported: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes("user_id,playlist_id,track_id\nu0,p0,caf\xe9\n".encode("latin-1"))
    with pytest.raises(MasrError, match="iconv -f WINDOWS-1252 -t UTF-8 latin1.csv"):
        score_file(path, exported, tmp_path / "o.csv", ScoreConfig(k=3))


def test_plain_double_quotes_in_a_tsv_are_text(tmp_path: Path, exported: Path) -> None:
    """A TSV whose quotes are plain text inside fields (an unmatched one per line, which a
    quote-aware parse rejects as malformed) scores like the same file without them."""
    rows = [("u0", "p0", "s1", '12" mix'), ("u0", "p0", 's"99', "x"), ("u1", "p1", "s5", 'a "b')]
    text = "\n".join(["user_id\tplaylist_id\ttrack_id\tnote", *("\t".join(r) for r in rows)])
    path = tmp_path / "in.tsv"
    path.write_text(text + "\n")
    summary = score_file(path, exported, tmp_path / "o.csv", ScoreConfig(k=3, read_rows=2))
    assert summary.playlists == 2 and summary.unknown_song_rows == 1
    plain = write_csv(tmp_path / "plain.csv", [r[:3] for r in rows if '"' not in r[2]])
    score_file(plain, exported, tmp_path / "p.csv", ScoreConfig(k=3))
    assert (tmp_path / "o.csv").read_text() == (tmp_path / "p.csv").read_text()


def test_k_larger_than_the_free_catalog_returns_what_is_left(
    tmp_path: Path, exported: Path
) -> None:
    rows = [("u0", "big", f"s{i}") for i in range(45)]
    src = write_csv(tmp_path / "in.csv", rows)
    summary = score_file(src, exported, tmp_path / "o.csv", ScoreConfig(k=100))
    recs = read_out(tmp_path / "o.csv")
    assert sorted(recs["track_id"].to_list()) == ["s45", "s46", "s47"]
    assert summary.short_playlists == 1


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda d: d / "missing.csv", "missing.csv: no such file"),
        (lambda d: d, "is a directory"),
        (lambda d: (d / "e.csv").write_text("") or d / "e.csv", "empty file"),
        (lambda d: write_csv(d / "h.csv", []), "no data rows"),
        (
            lambda d: write_csv(d / "c.csv", [("a", "b")], "user_id,playlist_id"),
            "missing column 'track_id'.*--track-col",
        ),
        (lambda d: write_csv(d / "n.csv", [("u0", "", "s1")]), "no playlist id \\(empty"),
    ],
)
def test_bad_input_is_one_clear_error_and_no_output(
    tmp_path: Path, exported: Path, make, match: str
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with pytest.raises(MasrError, match=match):
        score_file(make(src), exported, tmp_path / "o.csv")
    assert not (tmp_path / "o.csv").exists()


def test_bad_model_files_are_one_clear_error(tmp_path: Path, exported: Path) -> None:
    src = write_csv(tmp_path / "in.csv", ROWS[:1])
    with pytest.raises(MasrError, match="no such file; export one first"):
        score_file(src, tmp_path / "none.onnx")
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage" * 100)
    with pytest.raises(MasrError, match="not a readable ONNX model"):
        score_file(src, corrupt)
    # a copy whose id map was swapped for another export's
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in exported.parent.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    songs = copy / "masr.onnx.songs.parquet"
    pl.read_parquet(songs).reverse().write_parquet(songs)
    with pytest.raises(MasrError, match="songs.parquet: does not belong to masr.onnx"):
        score_file(src, copy / "masr.onnx")
    songs.unlink()
    with pytest.raises(MasrError, match="songs.parquet: id map missing"):
        score_file(src, copy / "masr.onnx")
    (copy / "masr.onnx.json").write_text(json.dumps({"export_id": "other"}))
    with pytest.raises(MasrError, match="belongs to another export"):
        score_file(src, copy / "masr.onnx")


@pytest.mark.parametrize(
    ("config", "match"),
    [(ScoreConfig(k=0), "--k 0"), (ScoreConfig(batch_size=0), "--batch-size 0"),
     (ScoreConfig(device="tpu"), "--device tpu")],
)  # fmt: skip
def test_bad_options(tmp_path: Path, exported: Path, config: ScoreConfig, match: str) -> None:
    with pytest.raises(MasrError, match=match):
        score_file(write_csv(tmp_path / "in.csv", ROWS[:1]), exported, config=config)


def test_cuda_request_fails_cleanly_without_a_usable_gpu(tmp_path: Path, exported: Path) -> None:
    model = ExportedModel(exported, "auto")
    if model.provider == "cuda":
        pytest.skip("a CUDA device is usable here")
    with pytest.raises(MasrError, match="--device cuda: ONNX Runtime cannot use CUDA"):
        ExportedModel(exported, "cuda")


def test_the_scoring_path_never_imports_torch() -> None:
    code = (
        "import sys, masr, masr.score, masr_cli.score, masr_cli.main\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_playlist_belongs_to_the_user_with_most_of_its_rows(
    tmp_path: Path, exported: Path
) -> None:
    """As in masr prep: the majority user (ties: the smallest id) is the playlist's user."""
    model = ExportedModel(exported, "cpu")
    mixed = [("u5", "mix", "s1"), ("u2", "mix", "s2"), ("u5", "mix", "s3"), ("u2", "tie", "s4"),
             ("u1", "tie", "s5")]  # fmt: skip
    score_file(
        write_csv(tmp_path / "a.csv", mixed), exported, tmp_path / "a_out.csv", ScoreConfig(k=3)
    )
    songs, scores = model.top_k(
        np.array([5, 1]), np.array([-1, -1]), np.array([[1, 2, 3], [4, 5, -1]]), 3
    )
    recs = read_out(tmp_path / "a_out.csv")
    assert recs["track_id"].to_list() == [f"s{i}" for i in songs.reshape(-1)]


def test_a_known_playlist_without_a_user_keeps_its_training_user(
    tmp_path: Path, exported: Path
) -> None:
    """Rows of a training playlist that name no user score as with the user it was trained
    with, not as a new user's."""
    data = exported.parent.parent / "data"
    owners = pl.read_parquet(data / "playlists.parquet").join(
        pl.read_parquet(data / "users.parquet"), on="user_idx"
    )
    owner = owners.filter(pl.col("playlist_id") == "p0")["user_id"].item()
    rows = [("p0", "s1"), ("p0", "s2"), ("new", "s3")]
    blank = write_csv(tmp_path / "blank.csv", [("", p, t) for p, t in rows])
    named = write_csv(tmp_path / "named.csv", [(owner if p == "p0" else "", p, t) for p, t in rows])
    config = ScoreConfig(k=5)
    summary = score_file(blank, exported, tmp_path / "blank_out.csv", config)
    score_file(named, exported, tmp_path / "named_out.csv", config)
    assert summary.new_user_playlists == 1  # the new playlist's, with no user at all
    out = read_out(tmp_path / "blank_out.csv")
    assert out.equals(read_out(tmp_path / "named_out.csv"))
    assert out.filter(pl.col("playlist_id") == "p0").height == 5


@pytest.mark.parametrize("blank", ['""', '"  "', "  "])
def test_blank_ids_are_missing_ones_as_empty_fields_are(
    tmp_path: Path, exported: Path, blank: str
) -> None:
    """A blank id, quoted as a database's CSV writes an empty string, reads as an empty field:
    a blank user keeps a training playlist its user, a blank track is a row without a track
    (not an unknown song), a blank playlist id is the error an empty one is (QA: a playlist ""
    was scored, a user "" made p0 a new user's)."""
    header = "user_id,playlist_id,track_id\n"
    empty = tmp_path / "empty.csv"
    empty.write_text(header + ",p0,s1\nu0,p0,\n")
    quoted = tmp_path / "quoted.csv"
    quoted.write_text(header + f"{blank},p0,s1\nu0,p0,{blank}\n")
    config = ScoreConfig(k=3)
    want = score_file(empty, exported, tmp_path / "e.csv", config)
    got = score_file(quoted, exported, tmp_path / "q.csv", config)
    counts = [(s.new_user_playlists, s.unknown_song_rows, s.trackless_rows) for s in (want, got)]
    assert counts == [(0, 0, 1)] * 2
    assert (tmp_path / "q.csv").read_text() == (tmp_path / "e.csv").read_text()
    nameless = tmp_path / "nameless.csv"
    nameless.write_text(header + f"u0,{blank},s1\n")
    with pytest.raises(MasrError, match="1 row\\(s\\) have no playlist id"):
        score_file(nameless, exported, tmp_path / "n.csv", config)
    assert not (tmp_path / "n.csv").exists()


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-1, 6), st.integers(0, 20)), min_size=1, max_size=120),
    st.integers(1, 40),
    st.integers(1, 10),
    st.none() | st.integers(1, 200),
)
def test_batch_plan_covers_every_playlist_once(rows, batch_size, cap, max_cells) -> None:
    users = np.array([u for u, _ in rows])
    lengths = np.array([n for _, n in rows])
    batches = plan_batches(users, lengths, batch_size, group_cap=cap, max_cells=max_cells)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(rows)))
    assert all(1 <= len(b) <= batch_size for b in batches)
    unknown = np.flatnonzero(users[flat] == -1)  # new users share one query: kept together
    assert len(unknown) == 0 or unknown[-1] - unknown[0] == len(unknown) - 1
    # ... in calls of their own: known users beside them would each pad to their count
    assert all(len(np.unique(users[b] == -1)) == 1 for b in batches)
    if max_cells is not None:  # the cell budget only cuts calls further, never reorders
        unsplit = plan_batches(users, lengths, batch_size, group_cap=cap)
        assert flat.tolist() == np.concatenate(unsplit).tolist()
        for part in batches:
            assert len(part) == 1 or grid_cells(users[part], lengths[part]) <= max_cells


def test_engine_bounds_its_calls_by_the_graph_chunk(
    exported: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine reads the export's chunk (16 here) and splits calls whose grid x chunk would
    pass MAX_GRID_FLOATS; the results do not change."""
    import masr.score as score

    users = np.arange(36) % 12
    playlists = np.arange(36)
    members = [np.arange(i % 5, i % 5 + 1 + i % 7) for i in range(36)]
    whole = ExportedModel(exported, "cpu", batch_size=64)
    assert whole.max_cells == score.MAX_GRID_FLOATS // 16
    expected = whole.recommend(users, playlists, members, 5)
    monkeypatch.setattr(score, "MAX_GRID_FLOATS", 16 * 8)
    small = ExportedModel(exported, "cpu", batch_size=64)
    assert small.max_cells == 8
    calls = []
    own = small.top_k
    monkeypatch.setattr(small, "top_k", lambda *a: calls.append(len(a[0])) or own(*a))
    songs, scores = small.recommend(users, playlists, members, 5)
    assert len(calls) > 1 and max(calls) < 36
    np.testing.assert_array_equal(songs, expected[0])
    np.testing.assert_allclose(scores, expected[1], rtol=1e-6)


def test_new_user_playlists_do_not_pad_the_known_users_beside_them() -> None:
    """QA: at --batch-size 512 with half the playlists of new users, the last call of their
    piece was filled with single-playlist known users, each padded to the piece's playlist
    count (5.9 GB peak RSS for 20,000 playlists); now each call's grid stays near its rows."""
    users = np.concatenate([np.full(700, -1), np.arange(700)])
    lengths = np.full(len(users), 10)
    for rows in plan_batches(users, lengths, 512):
        assert grid_cells(users[rows], lengths[rows]) <= 512 * 10


def test_batch_plan_pads_little_and_shares_user_queries() -> None:
    """AOTM-like skew (geometric playlists per user, one heavy new-user group, 3-20 members):
    the graph's padded slots (per call: users x most playlists of a user x most members) stay
    near the real member count, and each user query serves several playlists."""
    rng = np.random.default_rng(0)
    users = np.concatenate([np.repeat(np.arange(300), rng.geometric(1 / 6, 300)), np.full(80, -1)])
    lengths = 3 + rng.poisson(8, len(users))
    slots = queries = 0
    for rows in plan_batches(users, lengths, 32):
        _, per_user = np.unique(users[rows], return_counts=True)
        slots += len(per_user) * per_user.max() * lengths[rows].max()
        queries += len(per_user)
    assert slots / lengths.sum() < 1.6
    assert len(users) / queries > 3


def test_a_cuda_session_hints_at_a_whole_catalog_chunk(
    tmp_path: Path, exported: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA an export with the CPU's small loop step gets one hint line naming the option."""
    import masr.score as score

    real = score.Engine._session
    monkeypatch.setattr(
        score.Engine, "_session", lambda self, *a: (real(self, *a)[0], "cuda")
    )  # a CPU session labelled CUDA: only the provider name matters here
    lines: list[str] = []
    src = write_csv(tmp_path / "in.csv", ROWS[:2])
    score_file(src, exported, tmp_path / "o.csv", ScoreConfig(k=3), log=lines.append)
    hints = [line for line in lines if line.startswith("hint:")]
    assert hints == [
        "hint: this export walks the catalog 16 songs at a time (the CPU's best); for CUDA, "
        "masr export --chunk 49 scores faster"
    ]
    assert read_out(tmp_path / "o.csv").height == 3


def _export_with_columns(tmp_path: Path, exported: Path, columns: dict[str, str] | None) -> Path:
    """A copy of the export whose metadata file records ``columns`` as its training data's."""
    import shutil

    for f in exported.parent.iterdir():
        if f.name.startswith(exported.name):
            shutil.copy(f, tmp_path / f.name)
    side = tmp_path / f"{exported.name}.json"
    meta = json.loads(side.read_text())
    meta["data"]["columns"] = columns
    side.write_text(json.dumps(meta))
    return tmp_path / exported.name


def test_input_columns_default_to_the_training_datas(tmp_path: Path, exported: Path) -> None:
    """masr prep --user-col owner ...: masr score reads the same names without options; an
    option still wins, field by field; an export without recorded columns keeps the defaults."""
    from masr.score import input_columns

    model = _export_with_columns(tmp_path, exported, {"user": "owner", "playlist": "pid",
                                                      "track": "uri"})
    said: list[str] = []
    assert input_columns(model, say=said.append) == Columns("owner", "pid", "uri")
    assert said and "user = owner" in said[0]
    given = {"user": None, "playlist": None, "track": "song"}
    assert input_columns(model, given) == Columns("owner", "pid", "song")
    assert input_columns(tmp_path / "no-such.onnx") == Columns()
    (tmp_path / "old").mkdir()
    assert input_columns(_export_with_columns(tmp_path / "old", exported, None)) == Columns()

    frame = pl.DataFrame({"owner": ["u0", "u0"], "pid": ["p0", "p0"], "uri": ["s1", "s2"]})
    frame.write_csv(tmp_path / "in.csv")
    summary = score_file(tmp_path / "in.csv", model, tmp_path / "o.csv", ScoreConfig(k=3))
    assert summary.playlists == 1 and read_out(tmp_path / "o.csv").height == 3
    with pytest.raises(MasrError, match="missing columns 'user_id'.*--user-col"):
        score_file(tmp_path / "in.csv", model, None, ScoreConfig(k=3, columns=Columns()))
    # an option the export cannot serve is refused before the columns' line (review: that
    # line came first for an export with other names, the MPD case)
    said.clear()
    with pytest.raises(MasrError, match="is an exact export"):
        score_file(tmp_path / "in.csv", model, None, ScoreConfig(k=3, candidates=5),
                   log=said.append)
    assert said == []


def test_read_metadata_props_reads_what_onnx_reads_without_the_graph(
    exported: Path, tmp_path: Path
) -> None:
    """``read_metadata_props`` (the protobuf wire format alone) gives the same entries as
    onnx's full parse, for a whole export and a model without entries; a file that is not a
    protobuf message, or one cut short, is a ValueError."""
    import onnx
    from onnx import TensorProto, helper

    from masr.onnx_format import read_metadata_props

    proto = onnx.load_model(str(exported), load_external_data=False)
    assert read_metadata_props(exported) == {e.key: e.value for e in proto.metadata_props}
    assert read_metadata_props(exported)["format"] == '"masr-onnx"'
    bare = helper.make_model(
        helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
    )
    bare.metadata_props.add(key="ünï", value="{\"a\": [1, 2]}")
    path = tmp_path / "bare.onnx"
    path.write_bytes(bare.SerializeToString())
    assert read_metadata_props(path) == {"ünï": "{\"a\": [1, 2]}"}
    # an entry with a field of another number (protobuf readers skip it, as onnx does), and a
    # fixed-width top-level field: read past, not refused
    entry = b"\x0a\x01k\x12\x01v\x18\x05"
    extra = tmp_path / "extra.onnx"
    extra.write_bytes(bare.SerializeToString() + b"\x72" + bytes([len(entry)]) + entry)
    assert onnx.load_model(str(extra)).metadata_props[-1].value == "v"
    assert read_metadata_props(extra) == {"ünï": "{\"a\": [1, 2]}", "k": "v"}
    fixed = tmp_path / "fixed.onnx"
    fixed.write_bytes(bare.SerializeToString() + b"\xf9\x07" + bytes(8))  # field 127, fixed64
    assert read_metadata_props(fixed) == {"ünï": "{\"a\": [1, 2]}"}
    short = tmp_path / "short.onnx"
    short.write_bytes(bare.SerializeToString() + b"\xf9\x07" + bytes(3))  # cut inside it
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(exported.read_bytes()[: exported.stat().st_size // 2])
    text = tmp_path / "text.onnx"
    text.write_text("hello, this is not a model\n" * 10)
    for bad in (cut, text, short):
        with pytest.raises(ValueError):
            read_metadata_props(bad)


def test_complete_playlists_keep_one_chunk() -> None:
    """A playlist carried over from read chunk to read chunk is one chunk, not one per read
    (QA: a playlist's carry piled up a polars chunk per read chunk, so with a small --read-rows
    every later step slowed: 4,000 playlists at --read-rows 7 took 84 s, 2,000 took 30 s)."""
    from masr.score import _complete_playlists

    rows = [(f"p{i // 5}", f"s{i}") for i in range(300)]  # 60 playlists of 5 rows
    frames = [
        pl.DataFrame(rows[i : i + 3], schema=["playlist", "track"], orient="row")
        for i in range(0, len(rows), 3)
    ]
    out = list(_complete_playlists(frames, Path("in.csv")))
    assert max(frame.n_chunks() for frame in out) <= 2  # the carry and one read: not growing
    assert pl.concat(out).rows() == rows  # every row, in order
    seen = [set(frame["playlist"]) for frame in out]  # each playlist whole in one frame
    assert sum(map(len, seen)) == len(set().union(*seen)) == 60


def test_exported_readme_reads_metadata_with_onnx_runtime_alone(exported: Path) -> None:
    """exported/README.md's metadata snippet for the scoring-only install (no `onnx` there)
    runs as written and gives the keys of the JSON beside the model."""
    import re

    text = (Path(__file__).resolve().parents[1] / "exported" / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "get_modelmeta" in b]
    assert len(blocks) == 1
    scope: dict = {}
    exec(blocks[0].replace('"exported/masr.onnx"', repr(str(exported))), scope)
    side = json.loads(exported.with_name(exported.name + ".json").read_text())
    assert {k: v for k, v in side.items() if k != "model_sha256"} == scope["meta"]
