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
