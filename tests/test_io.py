"""Reading inputs: formats, real-export quirks, column options and one-line errors."""

from __future__ import annotations

import gzip
import hashlib

import polars as pl
import pytest

from masr.errors import MasrError
from masr.io import Columns, quote_char, read_interactions

ROWS = [("u1", "p1", "t1"), ("u1", "p1", "t2"), ("u2", "p2", "t1")]


def _frame() -> pl.DataFrame:
    return pl.DataFrame(ROWS, schema=["user_id", "playlist_id", "track_id"], orient="row")


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("in.csv", "csv"),
        ("in.tsv", "tsv"),
        ("in.csv.gz", "csv+gzip"),
        ("in.tsv.gz", "tsv+gzip"),
        ("in.parquet", "parquet"),
        ("in.data", "csv"),
        ("tabs.csv", "tsv"),  # a tab-separated header, whatever the name
        ("tabs.gz", "tsv+gzip"),
        ("tabs.txt", "tsv"),
        ("semi.csv", "csv-semicolon"),  # a spreadsheet's CSV where the decimal mark is a comma
        ("semi.csv.gz", "csv-semicolon+gzip"),
        ("pipes.txt", "csv-pipe"),  # a database export
        ("commas.tsv", "csv"),  # a comma-separated header, whatever the name (QA)
        ("commas.tab.gz", "csv+gzip"),
    ],
)
def test_formats(tmp_path, name, fmt):
    path = tmp_path / name
    df = _frame()
    if fmt == "parquet":
        df.write_parquet(path)
    else:
        sep = {"tsv": "\t", "csv-semicolon": ";", "csv-pipe": "|"}.get(fmt.split("+")[0], ",")
        text = df.write_csv(separator=sep)
        data = text.encode()
        path.write_bytes(gzip.compress(data) if "gzip" in fmt else data)
    raw = read_interactions(path)
    assert raw.format == fmt and raw.rows == 3
    assert raw.frame.select("user", "playlist", "track").rows() == ROWS
    assert raw.checksum == hashlib.sha256(path.read_bytes()).hexdigest()


def test_real_export_quirks_bom_crlf_quotes_newlines_unicode(tmp_path):
    text = (
        "\ufeffuser_id,playlist_id,track_id,track_name,position\r\n"
        '7,"p,1",spotify:track:4uLU6hMCjMI75M1A2tKUQC,"He said ""hi"", then\r\nleft",0\r\n'
        '7,"p,1",ünïcødé-ид,plain,1\r\n'
        "08,p2,0042,x,2\r\n"
    )
    path = tmp_path / "export.csv"
    path.write_bytes(text.encode("utf-8"))
    raw = read_interactions(path)
    f = raw.frame
    assert f["user"].to_list() == ["7", "7", "08"]  # ids stay strings, leading zeros kept
    assert f["playlist"].to_list() == ["p,1", "p,1", "p2"]
    assert f["track"].to_list() == ["spotify:track:4uLU6hMCjMI75M1A2tKUQC", "ünïcødé-ид", "0042"]
    assert f["track_name"][0] == 'He said "hi", then\r\nleft'
    assert f["position"].to_list() == [0, 1, 2]


def _bare_quotes(sep: str) -> str:
    """An export whose double quotes are plain text inside unquoted fields, on several lines
    (so that a quote-aware parse pairs them across lines), as database and shell exports
    write them; TSV defines its fields that way."""
    rows = [
        ("u1", "p1", 'spotify:track:1"a', 'Don\'t Stop "Believin'),
        ("u1", "p1", "t2", 'The 12" mix'),
        ("u2", "p2", "t1", "plain"),
        ("u2", "p2", 't"3', '"Heroes"' if sep == "\t" else "x"),
    ]
    lines = [sep.join(("user_id", "playlist_id", "track_id", "track_name"))]
    return "\n".join([*lines, *(sep.join(r) for r in rows)]) + "\n"


@pytest.mark.parametrize(
    ("name", "sep"), [("bare.tsv", "\t"), ("bare.csv", ","), ("bare.tsv.gz", "\t")]
)
def test_plain_double_quotes_inside_unquoted_fields(tmp_path, name, sep):
    text = _bare_quotes(sep)
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    with pytest.raises(pl.exceptions.ComputeError, match="malformed"):  # what polars alone does
        pl.scan_csv(path, separator=sep, infer_schema=False, quote_char='"').collect()
    raw = read_interactions(path)
    f = raw.frame
    assert raw.rows == 4
    assert f["track"].to_list() == ['spotify:track:1"a', "t2", "t1", 't"3']
    assert f["user"].to_list() == ["u1", "u1", "u2", "u2"]
    names = f["track_name"].to_list()
    assert names[:3] == ['Don\'t Stop "Believin', 'The 12" mix', "plain"]
    if sep == "\t":
        assert names[3] == '"Heroes"'  # TSV has no quoting: the quotes are the title's


def test_quoted_csv_keeps_its_quoting(tmp_path):
    """A file that parses quote-aware is read quote-aware, even with bare quotes in it."""
    path = tmp_path / "q.csv"
    path.write_text('user_id,playlist_id,track_id\nu,"p,1","say ""hi"""\nu,"p,1",a"b"c\n')
    assert quote_char(path, "csv") == '"'
    assert read_interactions(path).frame["track"].to_list() == ['say "hi"', 'a"b"c']
    plain = tmp_path / "plain.tsv"
    plain.write_text(_bare_quotes("\t"))
    assert quote_char(plain, "tsv") is None


def test_csv_mixing_quoted_fields_and_bare_quotes_is_one_error(tmp_path):
    path = tmp_path / "mixed.csv"
    path.write_text(
        'user_id,playlist_id,track_id\nu1,"p,1",x"y\nu1,"p,1",t2\nu2,p2,z"w\nu2,p2,"q"\n'
    )
    msg = _error(path)
    assert "quotes some fields" in msg and "TSV" in msg


def test_column_options_rename(tmp_path):
    path = tmp_path / "in.csv"
    pl.DataFrame(
        {"owner": ["a", "a"], "pid": ["1", "1"], "uri": ["x", "y"], "other": [1, 2]}
    ).write_csv(path)
    raw = read_interactions(path, Columns(user="owner", playlist="pid", track="uri"))
    assert raw.frame.columns == ["user", "playlist", "track"]
    assert raw.frame["track"].to_list() == ["x", "y"]


def test_semicolon_csv_keeps_its_quoting_and_commas(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_text('user_id;playlist_id;track_id\n"a;1";p;"x, y"\na;p;"say ""hi"""\n')
    raw = read_interactions(path)
    assert raw.format == "csv-semicolon"
    assert raw.frame.select("user", "track").rows() == [("a;1", "x, y"), ("a", 'say "hi"')]


def test_a_directory_of_parquet_parts_reads_as_one_table(tmp_path):
    """Spark's layout: part files (also in key=value partition folders, whose key becomes a
    column), beside bookkeeping files that are not parts."""
    flat = tmp_path / "flat"
    flat.mkdir()
    _frame().slice(0, 2).write_parquet(flat / "part-00000.parquet")
    _frame().slice(2, 1).write_parquet(flat / "part-00001.parquet")
    (flat / "_SUCCESS").write_text("")
    (flat / ".part-00000.parquet.crc").write_bytes(b"\0junk")
    raw = read_interactions(flat)
    assert raw.format == "parquet" and raw.frame.select("user", "playlist", "track").rows() == ROWS
    assert raw.checksum and read_interactions(flat).checksum == raw.checksum
    _frame().slice(2, 1).write_parquet(flat / "part-00001.parquet", compression="uncompressed")
    assert read_interactions(flat).checksum != raw.checksum  # the parts' bytes count
    hive = tmp_path / "hive"
    for user in ("u1", "u2"):
        (hive / f"user_id={user}").mkdir(parents=True)
        _frame().filter(pl.col("user_id") == user).drop("user_id").write_parquet(
            hive / f"user_id={user}" / "part-0.parquet"
        )
    got = read_interactions(hive).frame.select("user", "playlist", "track")
    got = got.sort("playlist", "track")
    assert got.rows() == sorted(ROWS, key=lambda r: (r[1], r[2]))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "_SUCCESS").write_text("")
    with pytest.raises(MasrError, match="is a directory without Parquet parts"):
        read_interactions(empty)


def test_a_list_column_of_tracks_is_one_row_per_song(tmp_path):
    """One row per playlist with its songs as a list (and positions as a list beside them)."""
    path = tmp_path / "lists.parquet"
    pl.DataFrame(
        {
            "user_id": ["u1", "u2"],
            "playlist_id": ["p1", "p2"],
            "track_id": [["t1", "t2"], ["t1"]],
            "position": [[1, 0], [0]],
            "tags": [["a", "b", "c"], []],  # a list per playlist, not per song: not read
        }
    ).write_parquet(path)
    raw = read_interactions(path)
    assert raw.frame.select("user", "playlist", "track").rows() == ROWS
    assert raw.frame["position"].to_list() == [1, 0, 0]
    named = tmp_path / "named.parquet"
    pl.read_parquet(path).rename({"position": "order"}).write_parquet(named)
    assert read_interactions(named, Columns(position="order")).frame["position"].to_list() == [
        1, 0, 0
    ]
    bad = tmp_path / "bad.parquet"
    pl.DataFrame({"user_id": [["u1"]], "playlist_id": ["p1"], "track_id": ["t1"]}).write_parquet(
        bad
    )
    with pytest.raises(MasrError, match="'user_id' holds lists"):
        read_interactions(bad)


def _mpd_slice(pids, songs_per=3, empty=()):
    """A Million Playlist Dataset slice: playlists with their tracks (pos, track_uri, ...)."""
    return {
        "info": {"slice": "0-1", "version": "v1"},
        "playlists": [
            {
                "name": f"list {pid}",
                "pid": pid,
                "num_tracks": songs_per,
                "tracks": []
                if pid in empty
                else [
                    {"pos": j, "track_uri": f"spotify:track:{pid + j}", "track_name": f"s{j}",
                     "artist_name": "a", "duration_ms": 1}
                    for j in range(songs_per)
                ],
            }
            for pid in pids
        ],
    }


def test_million_playlist_dataset_json(tmp_path):
    """MPD's slices (a file, gzipped or not, or its data/ folder of them) read as one row per
    song: the pid as playlist and as user (MPD has none), track_uri as track, pos as position,
    the tracks' names kept; playlists without tracks have no rows."""
    import json

    data = tmp_path / "data"
    data.mkdir()
    (data / "mpd.slice.0-1.json").write_text(json.dumps(_mpd_slice([0, 1], empty=(1,))))
    (data / "mpd.slice.2-3.json.gz").write_bytes(
        gzip.compress(json.dumps(_mpd_slice([2, 3], songs_per=2), indent=1).encode())
    )
    raw = read_interactions(data, extras_apart=True)
    assert raw.format == "json" and raw.rows == 3 + 2 + 2
    f = raw.frame
    assert f["user"].to_list() == f["playlist"].to_list() == ["0"] * 3 + ["2"] * 2 + ["3"] * 2
    assert f["track"].to_list()[:4] == [f"spotify:track:{i}" for i in (0, 1, 2, 2)]
    assert f["position"].to_list() == [0, 1, 2, 0, 1, 0, 1]
    assert raw.song_extras is not None and "track_name" in raw.song_extras.columns
    assert read_interactions(data).checksum == raw.checksum
    one = read_interactions(data / "mpd.slice.2-3.json.gz")
    assert one.format == "json+gzip" and one.rows == 4
    other = tmp_path / "other.json"
    other.write_text('{"rows": [1, 2]}')
    with pytest.raises(MasrError, match="Million Playlist Dataset's layout"):
        read_interactions(other)
    broken = tmp_path / "broken.json"
    broken.write_text('{"playlists": [')
    with pytest.raises(MasrError, match="unreadable JSON"):
        read_interactions(broken)
    # other JSON shapes say what JSON is read and what to give instead (a list of records was
    # read as a CSV with a column named '[{"user_id":...'; one record per line: a parser error)
    record = '{"user_id": "u", "playlist_id": "p", "track_id": "t"}'
    for name, text in (("records.json", f"[{record}, {record}]"),
                       ("lines.json", f"{record}\n{record}\n")):
        (tmp_path / name).write_text(text)
        with pytest.raises(MasrError, match="layout .*give other data .* as CSV, TSV or Parquet"):
            read_interactions(tmp_path / name)


def test_a_ragged_row_is_named_in_the_files_terms(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text("user_id,playlist_id,track_id\nu,p,t\nu,p,Song, with comma\n")
    with pytest.raises(MasrError, match="more fields than the header") as info:
        read_interactions(path)
    assert "truncate_ragged_lines" not in str(info.value)


def test_spaces_around_ids_are_not_part_of_them(tmp_path):
    path = tmp_path / "hand.csv"
    path.write_text("user_id, playlist_id, track_id\nu1, p1, t1\nu1 ,p1,\tt2 \nu1,p1, two words \n")
    raw = read_interactions(path)
    assert raw.frame.select("user", "playlist", "track").rows() == [
        ("u1", "p1", "t1"), ("u1", "p1", "t2"), ("u1", "p1", "two words")
    ]


def test_column_names_match_whatever_their_case_and_spaces(tmp_path):
    """Spreadsheet and hand-edited headers (``User_ID``, `` track_id ``) name the columns
    masr wants; exact names win, and two columns equal but for case are not guessed between."""
    path = tmp_path / "in.csv"
    path.write_text("User_ID , PLAYLIST_ID,track_id , Position,Track_Name\nu,p,t,3,Song\n")
    raw = read_interactions(path)
    assert raw.frame.select("user", "playlist", "track").rows() == [("u", "p", "t")]
    assert raw.frame["position"].to_list() == [3] and raw.frame["track_name"].to_list() == ["Song"]
    exact = tmp_path / "exact.csv"
    exact.write_text("user_id,USER_ID,playlist_id,track_id\nright,wrong,p,t\n")
    assert read_interactions(exact).frame["user"].to_list() == ["right"]
    both = tmp_path / "both.csv"
    both.write_text("User_Id,USER_ID,playlist_id,track_id\na,b,p,t\n")
    with pytest.raises(MasrError, match="--user-col 'user_id' is ambiguous: the file has "
                       "'User_Id' and 'USER_ID'"):
        read_interactions(both)
    mine = read_interactions(path, Columns(user="user_id ", playlist="playlist_id"))
    assert mine.frame["user"].to_list() == ["u"]
    twice = tmp_path / "twice.csv"  # a column named twice: neither is guessed
    twice.write_text("user_id,playlist_id,track_id,track_id\nu,p,t1,t2\n")
    with pytest.raises(MasrError, match="names column 'track_id' twice"):
        read_interactions(twice)


def test_parquet_integer_ids_become_strings(tmp_path):
    path = tmp_path / "ints.parquet"
    pl.DataFrame(
        {"user_id": [1, 2], "playlist_id": [10, 20], "track_id": [5, 6], "position": [0, 1]}
    ).write_parquet(path)
    raw = read_interactions(path)
    assert raw.frame["track"].to_list() == ["5", "6"]
    assert raw.frame["position"].dtype == pl.Int64


def test_parquet_float_ids_keep_their_whole_numbers(tmp_path):
    """Ids written as floats (pandas with missing values does it) read as the integers they
    hold, as the same ids written as integers; a real fraction stays as written."""
    path = tmp_path / "floats.parquet"
    pl.DataFrame(
        {"user_id": [1.0, 2.0], "playlist_id": [10.0, 20.5], "track_id": [143.0, 6.0]}
    ).write_parquet(path)
    raw = read_interactions(path)
    assert raw.frame["track"].to_list() == ["143", "6"]
    assert raw.frame["playlist"].to_list() == ["10", "20.5"]


def _error(path, columns=None) -> str:
    with pytest.raises(MasrError) as info:
        read_interactions(path, columns)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_missing_file(tmp_path):
    assert "no such file" in _error(tmp_path / "nope.csv")


def test_directory(tmp_path):
    assert "is a directory" in _error(tmp_path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_bytes(b"")
    assert "empty file" in _error(path)


def test_header_only(tmp_path):
    path = tmp_path / "header.csv"
    path.write_text("user_id,playlist_id,track_id\n")
    assert "no data rows" in _error(path)


def test_empty_gzip(tmp_path):
    path = tmp_path / "empty.csv.gz"
    path.write_bytes(gzip.compress(b""))
    assert "empty" in _error(path)


@pytest.mark.parametrize("cut", [4, 8, 100, 0.5])
def test_truncated_gzip(tmp_path, cut):
    rows = "".join(f"u{i % 7},p{i % 300},t{i * 7919 % 10007}\n" for i in range(5000))
    data = gzip.compress(("user_id,playlist_id,track_id\n" + rows).encode())
    n = int(len(data) * cut) if isinstance(cut, float) else len(data) - cut
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(data[:n])  # cut 4 or 8: only the trailer (CRC, size) is missing
    assert "unreadable or truncated" in _error(path)


def test_truncated_parquet(tmp_path):
    path = tmp_path / "cut.parquet"
    _frame().write_parquet(path)
    path.write_bytes(path.read_bytes()[:-20])
    assert "unreadable or truncated" in _error(path)


def test_not_utf8(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("user_id,playlist_id,track_id\nu,p,caf\xe9\n".encode("latin-1"))
    assert "UTF-8" in _error(path)
    assert "iconv -f WINDOWS-1252 -t UTF-8 latin1.csv > latin1-utf8.csv" in _error(path)


def test_utf16_text_names_the_conversion(tmp_path):
    """Excel's "Unicode Text" export: UTF-16 with a byte-order mark, tab-separated."""
    path = tmp_path / "export.txt"
    path.write_bytes("user_id\tplaylist_id\ttrack_id\nu\tp\tt\n".encode("utf-16"))
    message = _error(path)
    assert "UTF-16 text" in message and "iconv -f UTF-16 -t UTF-8 export.txt" in message


def test_missing_column_names_the_option(tmp_path):
    path = tmp_path / "in.csv"
    pl.DataFrame({"user_id": ["a"], "pid": ["1"], "track_id": ["x"]}).write_csv(path)
    msg = _error(path)
    assert "'playlist_id'" in msg and "--playlist-col" in msg and "pid" in msg
    # no user column at all (MPD): the error says how to make each playlist its own user
    mpd = tmp_path / "mpd.csv"
    pl.DataFrame({"pid": ["1"], "track_uri": ["x"]}).write_csv(mpd)
    msg = _error(mpd, Columns(playlist="pid", track="track_uri"))
    assert "'user_id'" in msg and "--user-col pid, one user per playlist" in msg
    raw = read_interactions(mpd, Columns(user="pid", playlist="pid", track="track_uri"))
    assert raw.frame.select("user", "playlist", "track").rows() == [("1", "1", "x")]


def test_null_ids(tmp_path):
    path = tmp_path / "nulls.csv"
    path.write_text("user_id,playlist_id,track_id\nu,p,t1\nu,p,\nu,p,  \n")
    msg = _error(path)
    assert "2 row(s) have an empty 'track_id'" in msg and "data row 2" in msg


def test_bad_position(tmp_path):
    path = tmp_path / "pos.csv"
    path.write_text("user_id,playlist_id,track_id,position\nu,p,t1,0\nu,p,t2,first\n")
    assert "position" in _error(path)


def _order(path, **cols):
    frame = read_interactions(path, Columns(**cols)).frame
    return frame["position"].to_list()


def test_position_col_names_the_order_column(tmp_path):
    """--position-col reads another column as the song order; an ordinary 'position' column is
    then just an unused column; a named column that is missing or an id is one error line."""
    path = tmp_path / "ts.csv"
    path.write_text("user_id,playlist_id,track_id,ts,position\nu,p,t1,300,0\nu,p,t2,100,1\n")
    assert _order(path, position="ts") == [300, 100]
    assert _order(path) == [0, 1]
    assert "--position-col" in _error(path, Columns(position="when"))
    assert "id column" in _error(path, Columns(position="track_id"))


def test_positions_as_dates_floats_and_text(tmp_path):
    """What real exports hold as an order: datetimes and dates (Parquet or ISO text), whole or
    fractional floats; each becomes integers in the same order, blanks stay missing."""
    from datetime import date, datetime

    base = {"user_id": ["u"] * 3, "playlist_id": ["p"] * 3, "track_id": ["a", "b", "c"]}
    cases = {
        "datetime": [datetime(2024, 5, 1, 12), datetime(2023, 1, 1), datetime(2024, 5, 1, 9)],
        "date": [date(2024, 5, 2), date(2023, 1, 1), date(2024, 5, 1)],
        "whole": [3.0, 1.0, 2.0],
        "fraction": [1.5, 0.25, 1.25],
        "iso": ["2024-05-01T12:00:00", "2023-01-01T00:00:00", "2024-05-01T09:00:00"],
        "iso_date": ["2024-05-02", "2023-01-01", "2024-05-01"],
        "number_text": ["1.5", "0.25", " 1.25 "],
        "blank": ["7", "", "5"],
    }
    for name, values in cases.items():
        path = tmp_path / f"{name}.parquet"
        pl.DataFrame({**base, name: values}).write_parquet(path)
        got = _order(path, position=name)
        if name == "blank":
            assert got == [7, None, 5]
            continue
        assert got[1] < got[2] < got[0], (name, got)
    assert _order(tmp_path / "whole.parquet", position="whole") == [3, 1, 2]
    # integers beyond Int64, as text or as UInt64, keep their exact order (as floats they tie)
    huge = [str(10**20 + 3), str(10**20 + 1), str(10**20 + 2)]
    pl.DataFrame({**base, "huge": huge}).write_parquet(tmp_path / "huge.parquet")
    assert _order(tmp_path / "huge.parquet", position="huge") == [3, 1, 2]
    wide = pl.Series("wide", [2**64 - 1, 2**63, 2**63 + 5], dtype=pl.UInt64)
    pl.DataFrame({**base}).with_columns(wide).write_parquet(tmp_path / "wide.parquet")
    assert _order(tmp_path / "wide.parquet", position="wide") == [3, 1, 2]
    # one unit however the date came: a Date, a Datetime in ns or ms and ISO text all read as
    # microseconds since the epoch
    day_us = 86_400 * 10**6
    assert _order(tmp_path / "iso_date.parquet", position="iso_date")[1] == 19358 * day_us
    assert _order(tmp_path / "date.parquet", position="date")[1] == 19358 * day_us
    for unit in ("ns", "ms"):
        path = tmp_path / f"datetime_{unit}.parquet"
        frame = pl.DataFrame({**base, "when": cases["datetime"]})
        frame.with_columns(pl.col("when").cast(pl.Datetime(unit))).write_parquet(path)
        assert _order(path, position="when") == _order(tmp_path / "iso.parquet", position="iso")


def test_an_id_column_of_records_is_refused(tmp_path):
    """A struct where an id belongs was read as the text '{"t0"}'."""
    ids = [{"uri": f"t{i}"} for i in range(3)]
    path = tmp_path / "structs.parquet"
    pl.DataFrame({"user_id": ["u"] * 3, "playlist_id": ["p"] * 3, "track_id": ids}).write_parquet(
        path
    )
    with pytest.raises(MasrError, match="id column 'track_id' \\(--track-col\\) holds records"):
        read_interactions(path)


def test_bad_position_names_the_value(tmp_path):
    path = tmp_path / "pos.csv"
    path.write_text("user_id,playlist_id,track_id,when\nu,p,t1,0\nu,p,t2,soon\n")
    msg = _error(path, Columns(position="when"))
    assert "'when'" in msg and "'soon'" in msg and "data row 2" in msg
    mixed = tmp_path / "mixed.csv"  # each value readable, but not as one kind
    mixed.write_text("user_id,playlist_id,track_id,when\nu,p,t1,3\nu,p,t2,2020-01-01\n")
    msg = _error(mixed, Columns(position="when"))
    assert "mixes dates ('2020-01-01', data row 2) and numbers ('3', data row 1)" in msg
    # a column of dates names its first value that is not one (QA: row 1's valid date was
    # named): a placeholder, another time zone offset, a second header from joined exports
    head = "user_id,playlist_id,track_id,when\n"
    dates = [f"u,p,t{i},2021-01-{i + 1:02d}T00:29:00" for i in range(5)]
    for odd, shown in (("n/a", "'n/a'"), ("2021-02-01T00:00:00+02:00", "+02:00'"),
                       ("user_id,playlist_id,track_id,when", "'when'")):
        dated = tmp_path / "dated.csv"
        odd_row = odd if odd.startswith("user_id") else f"u,p,t9,{odd}"
        dated.write_text(head + "\n".join([*dates[:3], odd_row, *dates[3:]]) + "\n")
        msg = _error(dated, Columns(position="when"))
        assert f"{shown} (data row 4), not a date or datetime in the form of the others" in msg
        assert "(e.g. '2021-01-01T00:29:00', data row 1" in msg


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (lambda d: __import__("bz2").compress(d), "bzip2-compressed"),
        (lambda d: __import__("lzma").compress(d), "xz-compressed"),
        (lambda d: gzip.compress(gzip.compress(d)), "gzipped twice"),
        (lambda d: bytes(range(256)) * 8, "binary content"),
        (lambda d: b"\x00\x01" + d, "binary content"),
    ],
)
def test_unreadable_formats_are_named(tmp_path, content, needle):
    path = tmp_path / "in.csv"
    path.write_bytes(content(_frame().write_csv().encode()))
    assert needle in _error(path)


@pytest.mark.parametrize("name", ["in.parquet.gz", "in.gz", "in.csv", "in"])
def test_gzipped_parquet_is_named_whatever_the_name(tmp_path, name):
    """Gzipped Parquet is recognised from its decompressed bytes, not only from a .parquet.gz
    name, so a file called otherwise and standard input's spool get the same line."""
    pq = tmp_path / "plain.parquet"
    _frame().write_parquet(pq)
    path = tmp_path / name
    path.write_bytes(gzip.compress(pq.read_bytes()))
    assert "gzipped Parquet is not supported; decompress it first" in _error(path)


def test_a_quote_left_open_is_named_not_polars_advice(tmp_path):
    """A field that opens a double quote and never closes it reads the rest of the file as one
    field: one line saying so, without the reader's advice on its own options."""
    path = tmp_path / "in.csv"
    path.write_text('user_id,playlist_id,track_id\nu1,p1,s1\nu1,"p1,s3\nu1,p1,s4\n')
    with pytest.raises(MasrError, match="double quote opens a field in column 'playlist_id' "
                       "that is never closed") as err:
        read_interactions(path)
    assert "infer_schema_length" not in str(err.value)


def test_blank_rows_are_skipped(tmp_path):
    """Empty lines (a trailing newline too many, a gap, CRLF ones) and rows of separators only
    (a spreadsheet's ``,,``) hold no interaction: skipped, not read as empty ids."""
    path = tmp_path / "in.csv"
    path.write_bytes(
        b"user_id,playlist_id,track_id\r\nu1,p1,s1\r\n\r\n,,\r\nu1,p1,s2\r\n \r\n\r\n"
    )
    raw = read_interactions(path)
    assert raw.frame.select("user", "playlist", "track").rows() == [
        ("u1", "p1", "s1"), ("u1", "p1", "s2")
    ]
    assert raw.rows == 2
    only_blank = tmp_path / "blank.csv"
    only_blank.write_text("user_id,playlist_id,track_id\n\n,,\n")
    with pytest.raises(MasrError, match="no data rows"):
        read_interactions(only_blank)


def test_tsv_quotes_that_open_a_field_are_plain_text(tmp_path):
    """In TSV a field may start with a double quote it does not close (a title such as
    "Heroes" (Live)): read as written, as TSV defines quotes."""
    path = tmp_path / "in.tsv"
    path.write_text(
        'user_id\tplaylist_id\ttrack_id\nu1\tp1\t"Heroes" (Live)\nu1\tp1\tx "y" z\n'
    )
    raw = read_interactions(path)
    assert raw.frame["track"].to_list() == ['"Heroes" (Live)', 'x "y" z']


def test_a_folder_of_parts_with_other_data_files_is_refused(tmp_path):
    """Parquet parts with a CSV beside them: the CSV would be silently left out, so one line
    names it; Spark's bookkeeping files (_SUCCESS, .crc) are not data."""
    folder = tmp_path / "table"
    folder.mkdir()
    _frame().write_parquet(folder / "part-0.parquet")
    (folder / "_SUCCESS").write_text("")
    (folder / ".part-0.parquet.crc").write_text("")
    assert read_interactions(folder).rows == len(ROWS)
    _frame().write_csv(folder / "more.csv")
    msg = _error(folder)
    assert "more.csv" in msg and "would not be read" in msg


def test_list_columns_of_different_lengths_are_named(tmp_path):
    path = tmp_path / "lists.parquet"
    pl.DataFrame(
        {"user_id": ["u1"], "playlist_id": ["p1"], "track_id": [["s1", "s2", "s3"]],
         "position": [[0, 1]]}
    ).write_parquet(path)
    msg = _error(path)
    assert "differ in length" in msg and "unreadable" not in msg


def test_an_empty_mpd_slice_says_it_has_no_playlists(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text('{"playlists": []}')
    msg = _error(path)
    assert "no playlists in it" in msg


def test_an_mpd_pid_read_twice_is_one_error_line(tmp_path):
    """A pid names one MPD playlist: a slice beside its own gzipped copy, or a pid twice in one
    slice, is refused rather than merged into one playlist."""
    import json

    data = tmp_path / "data"
    data.mkdir()
    text = json.dumps(_mpd_slice([0, 1]))
    (data / "mpd.slice.0-1.json").write_text(text)
    (data / "mpd.slice.0-1.json.gz").write_bytes(gzip.compress(text.encode()))
    msg = _error(data)
    assert "pid 0 is also in" in msg and "mpd.slice.0-1.json" in msg
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps(_mpd_slice([4, 4])))
    assert "pid 4 names 2 playlists" in _error(twice)
    apart = tmp_path / "apart"
    apart.mkdir()
    (apart / "mpd.slice.0-1.json").write_text(text)
    (apart / "mpd.slice.2-3.json").write_text(json.dumps(_mpd_slice([2, 3])))
    assert read_interactions(apart).rows == 4 * 3


def test_a_database_null_mark_is_no_id(tmp_path):
    """MySQL, PostgreSQL and Hive export NULL as \\N: read as an id, a Hive TSV's missing
    tracks became one song, the most popular of the catalog (QA)."""
    path = tmp_path / "hive.tsv"
    path.write_text("user_id\tplaylist_id\ttrack_id\nu\tp\tt1\nu\tp\t\\N\nu\tp\t \\N \n")
    msg = _error(path)
    assert "2 row(s) have \\N (a database export's NULL) as 'track_id'" in msg, msg
    assert "data row 2" in msg and "drop those rows" in msg
    # blanks are named first, as before; an id merely holding the mark stays an id
    path.write_text("user_id\tplaylist_id\ttrack_id\n\\N\tp\t\nu\tp\tx\\N\n")
    assert "1 row(s) have an empty 'track_id'" in _error(path)
    path.write_text("user_id\tplaylist_id\ttrack_id\nu\tp\tx\\N\nu\t\\Np\tt\n")
    raw = read_interactions(path)
    assert raw.frame.select("user", "playlist", "track").rows() == [
        ("u", "p", "x\\N"), ("u", "\\Np", "t")]


def test_a_database_null_mark_is_a_missing_position(tmp_path):
    """\\N in a text song-order column is a missing position, as a blank is (sorted last)."""
    path = tmp_path / "pos.tsv"
    path.write_text("user_id\tplaylist_id\ttrack_id\tposition\n"
                    "u\tp\tt1\t\\N\nu\tp\tt2\t2023-01-02\nu\tp\tt3\t\nu\tp\tt4\t2023-01-01\n")
    raw = read_interactions(path)
    assert raw.frame["position"].is_null().to_list() == [True, False, True, False]
