import numpy as np

from masr.dataset import load_prepared


def test_planted_loads_with_consistent_shapes(planted):
    d = planted
    assert d.indptr[-1] == len(d.train_song) == d.manifest["train"]
    assert len(d.valid) == len(d.test) == d.n_playlists
    # negatives never hold a song of their playlist
    for cases in (d.valid, d.test):
        for p, s, negs in zip(cases.playlist, cases.song, cases.negatives, strict=True):
            members = set(d.playlist_songs(p)) | {s}
            assert not members & set(negs[negs >= 0].tolist())
    assert np.all(d.playlist_user[d.test.playlist] == d.test.user)


def test_missing_dir_is_a_clear_error(tmp_path):
    import pytest

    from masr.errors import MasrError

    with pytest.raises(MasrError, match="masr prep"):
        load_prepared(tmp_path / "nope")


def test_atomic_writes_get_ordinary_permissions(tmp_path):
    import os
    import stat

    from masr.atomic import atomic_dir, atomic_file, atomic_path

    mask = os.umask(0o022)
    try:
        with atomic_file(tmp_path / "a.txt") as fh:
            fh.write(b"x")
        with atomic_path(tmp_path / "b.bin") as tmp:
            tmp.write_bytes(b"y")
        with atomic_dir(tmp_path / "d") as tmp:
            (tmp / "f").write_text("z")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.bin").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755
    assert (tmp_path / "d" / "f").read_text() == "z"


def test_atomic_file_leaves_nothing_on_failure(tmp_path):
    import pytest

    from masr.atomic import atomic_file

    (tmp_path / "out.csv").write_text("old")
    with pytest.raises(RuntimeError), atomic_file(tmp_path / "out.csv") as fh:
        fh.write(b"half")
        raise RuntimeError("boom")
    assert (tmp_path / "out.csv").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]


def test_atomic_writes_follow_links_and_never_replace_devices(tmp_path):
    """A link stays a link (the file it names is replaced); a device such as /dev/null is
    written in place by a single file's writer and refused for a set of files."""
    import os

    import pytest

    from masr.atomic import atomic_file, atomic_group
    from masr.errors import MasrError

    (tmp_path / "real.csv").write_text("old")
    os.symlink("real.csv", tmp_path / "link.csv")
    with atomic_file(tmp_path / "link.csv") as fh:
        fh.write(b"new")
    assert os.path.islink(tmp_path / "link.csv")
    assert (tmp_path / "real.csv").read_text() == "new"
    with atomic_file(os.devnull) as fh:
        fh.write(b"discarded")
    assert not os.path.isfile(os.devnull) and os.path.exists(os.devnull)
    with pytest.raises(MasrError, match="not a regular file"), atomic_group() as stage:
        stage(os.devnull)


def test_a_manifest_that_is_not_masr_preps_is_one_clear_error(planted_dir, tmp_path):
    """JSON that is not a `masr prep` manifest (QA: `masr evaluate --json` written over it gave
    a KeyError traceback in every later command): one MasrError naming the file and the fix,
    from the loader and from the export's search for the checkpoints' data."""
    import json

    import pytest

    from masr.errors import MasrError
    from masr.export.sources import locate_data

    manifest = planted_dir / "manifest.json"
    good = json.loads(manifest.read_text())
    for text, why in (
        ("[]", "not a JSON object"),
        (json.dumps({"mdr": {"hit@10": 0.5}}), "no count of users"),
        (json.dumps({**good, "catalog_songs": "many"}), "no count of catalog songs"),
        (json.dumps({**good, "playlists": True}), "no count of playlists"),
        (json.dumps({k: v for k, v in good.items() if k != "fingerprint"}), "no fingerprint"),
    ):
        manifest.write_text(text)
        with pytest.raises(MasrError, match="not a `masr prep` manifest") as err:
            load_prepared(planted_dir)
        assert why in str(err.value) and "rerun `masr prep`" in str(err.value)
    manifest.write_text("[]")
    with pytest.raises(MasrError, match="is not the data the checkpoints were trained on"):
        locate_data(tmp_path, [], good["fingerprint"], planted_dir)
    manifest.write_text(json.dumps(good))
    assert load_prepared(planted_dir).fingerprint == good["fingerprint"]
