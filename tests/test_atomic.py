"""masr.atomic: what a failed write is reported as, and the clean-up after a killed writer."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import polars as pl
import pytest

from masr.atomic import atomic_dir, atomic_group, atomic_path, remove_temp_entries
from masr.errors import MasrError

FULL = (
    "parquet: File out of specification: underlying IO error: No space left on device "
    "(os error 28)"
)


def test_a_polars_io_error_becomes_the_os_error_of_the_target(tmp_path: Path) -> None:
    """Polars reports a full disk as a ComputeError "(os error 28)": it is raised as the
    OSError it stands for, naming the file the user asked for, and nothing is left behind."""
    target = tmp_path / "x.parquet"
    with pytest.raises(OSError) as err, atomic_path(target):
        raise pl.exceptions.ComputeError(FULL)
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(target)
    assert err.value.strerror == os.strerror(errno.ENOSPC)
    assert list(tmp_path.iterdir()) == []


def test_an_os_error_about_the_temporary_file_names_the_target(tmp_path: Path) -> None:
    target = tmp_path / "recs.csv"
    with pytest.raises(OSError) as err, atomic_path(target) as tmp:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp))
    assert err.value.filename == str(target) and err.value.errno == errno.EROFS
    with pytest.raises(OSError) as err, atomic_path(target):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a write names no file
    assert err.value.filename == str(target)
    other = tmp_path / "input.csv"  # about another file: left as it is
    with pytest.raises(OSError) as err, atomic_path(target):
        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), str(other))
    assert err.value.filename == str(other)
    # not an OS error: untouched, whatever its text
    with pytest.raises(MasrError, match="os error 28"), atomic_path(target):
        raise MasrError("a message that quotes (os error 28)")
    with pytest.raises(KeyboardInterrupt), atomic_path(target):
        raise KeyboardInterrupt
    # Polars' own OSError names no file and carries no errno, only "(os error 28)" in its text
    with pytest.raises(OSError) as err, atomic_path(target):
        raise OSError("No space left on device (os error 28)")
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(target)
    assert list(tmp_path.iterdir()) == []


def test_a_device_written_in_place_is_named_by_its_errors() -> None:
    """/dev/full is written in place (not beside): a full-disk error names it, not nothing
    (QA: `masr score --out /dev/full` said only "No space left on device")."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with pytest.raises(OSError) as err, atomic_path("/dev/full") as path:
        assert str(path) == "/dev/full"
        with open(path, "wb", buffering=0) as fh:  # a real write, as score's CSV makes
            fh.write(b"playlist_id,rank,track_id,score\n")
    assert err.value.filename == "/dev/full" and err.value.errno == errno.ENOSPC


def test_sole_writer_removes_a_killed_writers_file_and_holds_the_lock(tmp_path: Path) -> None:
    """What a SIGKILL left beside --out (QA: score and synth never removed it) goes when the
    next writer of that name starts; a writer of another name keeps its own."""
    from masr.atomic import sole_writer

    left, other = tmp_path / ".recs.csv.abcd1234.tmp", tmp_path / ".other.csv.abcd1234.tmp"
    left.write_text("half")
    other.write_text("being written")
    said: list[str] = []
    with sole_writer(tmp_path / "recs.csv", "masr score", said.append):
        assert (tmp_path / "recs.csv.lock").is_file()
        assert not left.exists() and other.exists()
    assert said == [f"removed the temporary files of an earlier, killed masr score --out "
                    f"{tmp_path / 'recs.csv'}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name]  # the lock gone too


def test_a_folder_or_a_set_names_the_file_that_failed(tmp_path: Path) -> None:
    out = tmp_path / "data"
    with pytest.raises(OSError) as err, atomic_dir(out) as tmp:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / "train.parquet"))
    assert err.value.filename == str(out / "train.parquet")
    with pytest.raises(OSError) as err, atomic_dir(out):
        raise pl.exceptions.ComputeError(FULL)
    assert err.value.filename == str(out)
    with pytest.raises(OSError) as err, atomic_group() as stage:
        stage(tmp_path / "m.onnx")
        second = stage(tmp_path / "m.onnx.json")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(second))
    assert err.value.filename == str(tmp_path / "m.onnx.json")
    assert list(tmp_path.iterdir()) == []


def test_remove_temp_entries_takes_only_what_a_writer_of_those_names_left(tmp_path: Path) -> None:
    left = [".data.abcd_123.tmp", ".data.zz99zz99.old", ".best.pt.q1w2e3r4.tmp"]
    kept = [".data2.abcd1234.tmp", ".data.short.tmp", "data.abcd1234.tmp", "notes.tmp", "data"]
    for name in left + kept:
        if name.endswith(".old") or name == "data":
            (tmp_path / name).mkdir()
        else:
            (tmp_path / name).write_text("x")
    (tmp_path / ".data.zz99zz99.old" / "content").mkdir()
    assert remove_temp_entries(tmp_path, ["data"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept + [left[2]])
    assert remove_temp_entries(tmp_path) == 2  # every name: a folder masr owns whole
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept[1:])
    assert remove_temp_entries(tmp_path / "missing") == 0


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_place_where_nothing_can_be_created_is_named_at_once() -> None:
    """A folder that exists but takes no new file (/proc): the lock says so at once (QA: ten
    seconds of retries, then "other processes keep taking it"), and a temporary file's failure
    names the output, not the temporary name."""
    import time

    from masr.lock import locked

    start = time.monotonic()
    with pytest.raises(MasrError, match=r"/proc/masr-test\.lock: cannot be created"):
        with locked(Path("/proc/masr-test.lock"), "test"):
            pass
    assert time.monotonic() - start < 5
    with pytest.raises(OSError) as err:
        with atomic_path("/proc/masr-test.csv"):
            pass
    assert err.value.filename == "/proc/masr-test.csv"


def test_an_output_folder_that_is_a_dangling_link_is_named(tmp_path: Path) -> None:
    """mkdir of a link to nothing says only "File exists" (QA: reproduce --out dl)."""
    from masr.atomic import check_output_dir
    from masr.errors import MasrError

    (tmp_path / "dl").symlink_to(tmp_path / "nowhere")
    with pytest.raises(MasrError, match=r"--out .*dl: a link to .*nowhere, which does not exist"):
        check_output_dir(tmp_path / "dl", "--out")
    (tmp_path / "nowhere").mkdir()
    check_output_dir(tmp_path / "dl", "--out")  # a link to a folder is a folder


def test_outputs_where_nothing_can_be_made_or_inside_a_prep_folder_are_refused(
    tmp_path: Path,
) -> None:
    """reproduce --out and analyze --out: /proc/x is refused before any work, and so is a
    folder inside any masr prep output (another program's manifest.json does not count).
    train --runs is not probed: a folder of finished runs is only read."""
    from masr.atomic import check_output_dir
    from masr.dataset import MANIFEST, check_outside_prepared
    from masr.errors import MasrError

    if Path("/proc").is_dir():
        with pytest.raises(MasrError, match=r"--out /proc/x: nothing can be made in /proc"):
            check_output_dir("/proc/x", "--out")
    check_output_dir(tmp_path / "new" / "deeper", "--out")  # made later, fine now
    assert not any(p.name.startswith(".masr-check") for p in tmp_path.iterdir())
    (tmp_path / "prep").mkdir()
    (tmp_path / "prep" / MANIFEST).write_text(json.dumps(
        {"users": 3, "playlists": 9, "catalog_songs": 40, "fingerprint": "ab12"}))
    with pytest.raises(MasrError, match="inside the prepared data folder"):
        check_outside_prepared(tmp_path / "prep" / "results", "--out")
    check_outside_prepared(tmp_path / "beside", "--out")
    (tmp_path / "webapp").mkdir()
    (tmp_path / "webapp" / MANIFEST).write_text('{"name": "my-web-app"}')
    check_outside_prepared(tmp_path / "webapp" / "results", "--out")  # not masr prep's
    check_output_dir(tmp_path / "ro", "--runs", creatable=False)
