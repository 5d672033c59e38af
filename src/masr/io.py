"""Reading playlist interaction files: CSV, TSV or Parquet, optionally gzipped.

Real exports parse as they are: a UTF-8 byte-order mark, CRLF line ends, quoted fields that
hold commas, doubled quotes or newlines, and double quotes that are plain text inside unquoted
fields (TSV's rule, and what database and shell exports write: ``quote_char``). Ids are read
as strings (numbers, ``spotify:track:...`` and unicode all work). Every problem a user can fix
becomes one :class:`MasrError` line that names the file and the problem.
"""

from __future__ import annotations

import functools
import hashlib
import io
import re
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from masr.config import Columns
from masr.errors import MasrError

#: Extra song columns kept in songs.parquet when the input has them.
SONG_EXTRAS = ("track_name", "artist_name")
#: how MySQL, PostgreSQL (text COPY) and Hive export a NULL: never an id (QA: a Hive TSV's
#: missing tracks became one song, the catalog's most popular, recommended to every playlist)
NULL_MARK = "\\N"
#: Extra interaction column kept in train/valid/test when the input has it.
POSITION = "position"

_GZIP_MAGIC = b"\x1f\x8b"
_PARQUET_MAGIC = b"PAR1"
#: compressed or archive formats masr does not read, by their first bytes
_OTHER_MAGIC = {
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"PK\x03\x04": "zip",
    b"7z\xbc\xaf\x27\x1c": "7z",
}


def _utf8(line: bytes, cut: bool) -> bool:
    """``line`` decodes as UTF-8 (``cut``: it may end inside a character)."""
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return cut and exc.start >= len(line) - 3 and exc.reason == "unexpected end of data"
    return True


def _text_head(head: bytes, gz: bool) -> bytes:
    """The first bytes of the text inside ``head`` (inflated when gzipped; as far as the
    bytes go)."""
    if not gz:
        return head
    try:
        return zlib.decompressobj(wbits=31).decompress(head, 1 << 16)
    except zlib.error:
        return b""  # corrupt: the reader says so


@dataclass
class RawInput:
    """An input file read into a frame with columns ``user, playlist, track`` (String), plus
    ``position`` (Int64) and ``track_name`` / ``artist_name`` (String) when present."""

    frame: pl.DataFrame
    path: str
    format: str  # csv, tsv, csv-semicolon, csv-pipe, parquet, json; "+gzip" when compressed
    rows: int
    checksum: str  # sha256 of the input bytes
    #: with ``read_interactions(..., extras_apart=True)``: one row per track (``track`` plus the
    #: extras, each track's first row in input order) instead of extras on every row
    song_extras: pl.DataFrame | None = None


def detect_format(path: Path, head: bytes) -> tuple[str, bool]:
    """(kind, gzipped) from the file's first bytes, then its name: kind is csv, tsv,
    csv-semicolon, csv-pipe (``_SEPARATORS``), parquet (a file or a directory of parts) or json
    (the Million Playlist Dataset's slices: a file or a directory of them, ``mpd_json``)."""
    if path.is_dir():
        return ("parquet" if parquet_parts(path) else "json"), False
    gz = head.startswith(_GZIP_MAGIC)
    if head.startswith(_PARQUET_MAGIC):
        return "parquet", False
    text = _text_head(head, gz)
    if gz and text.startswith(_PARQUET_MAGIC):  # whatever its name, standard input included
        raise MasrError(f"{path}: gzipped Parquet is not supported; decompress it first")
    if text.lstrip(b"\xef\xbb\xbf \t\r\n").startswith((b"{", b"[")):  # "[": records
        return "json", gz
    for magic, name in _OTHER_MAGIC.items():
        if text.startswith(magic):
            raise MasrError(
                f"{path}: {name}-compressed, which masr does not read; give it as CSV, TSV or "
                "Parquet, plain or gzipped"
            )
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in (".gz", ".gzip"):
        suffixes = suffixes[:-1]
    last = suffixes[-1] if suffixes else ""
    if last in (".parquet", ".pq"):
        return "parquet", gz
    if gz and text.startswith(_GZIP_MAGIC):
        raise MasrError(f"{path}: gzipped twice; decompress it once")
    if text.startswith((b"\xff\xfe", b"\xfe\xff")):  # Excel's "Unicode Text", Windows tools
        raise MasrError(
            f"{path}: UTF-16 text; masr reads UTF-8: save it as \"CSV UTF-8\" or convert it "
            f"(iconv -f UTF-16 -t UTF-8 {path.name} > {path.stem}-utf8{path.suffix or '.csv'})"
        )
    first_line = text.split(b"\n", 1)[0]
    if b"\0" in first_line or not _utf8(first_line, cut=len(first_line) == len(text)):
        raise MasrError(
            f"{path}: binary content or a header that is not UTF-8 text: not a CSV, TSV or "
            "Parquet file (plain or gzipped)"
        )
    if last in (".tsv", ".tab") and (b"\t" in first_line or b"," not in first_line):
        return "tsv", gz  # a .tsv whose header has commas and no tab is a CSV (below)
    # a header with tabs and no comma is TSV, whatever the name (.csv, .txt, none); one with
    # semicolons (spreadsheets in locales whose decimal mark is a comma) or pipes (database
    # exports) and no comma or tab is separated by those
    if b"," not in first_line:
        for kind in ("tsv", "csv-semicolon", "csv-pipe"):
            if _SEPARATORS[kind].encode() in first_line:
                return kind, gz
    return "csv", gz


#: Polars' wording of input problems, in the terms of a playlist file (no reader options)
_PLAIN_WORDS = {
    "found more fields than defined in 'Schema' Consider setting 'truncate_ragged_lines=True'.": (
        "a row has more fields than the header: a separator inside a field that is not quoted?"
    ),
}


def unreadable(path: Path, exc: BaseException, what: str) -> MasrError:
    """The one error line for input that failed to parse: ``what`` and the reader's reason,
    or, for text that is not UTF-8, the conversion that makes it readable."""
    msg = one_line(exc)
    quote = re.search(r'could not parse `(")([^`]{0,40})[^`]*` as dtype \S+ at column (\S+)', msg)
    if quote:  # polars' reason for a quote left open: the rest of the file read as one field
        return MasrError(
            f"{path}: a double quote opens a field in column {quote.group(3)} that is never "
            f"closed (from `{quote.group(1)}{quote.group(2).strip()}`); close or remove it, or "
            "write the file as TSV"
        )
    if "exploded columns must have matching element counts" in msg:
        return MasrError(
            f"{path}: in a row, the track list and a list read with it song by song (positions, "
            "track or artist names) differ in length; make them equal, or drop that column"
        )
    # polars' advice on its own options (infer_schema_length, ...) is not the user's to take
    msg = msg.split(" The current offset in the file")[0]
    if "utf-8" in msg.lower() or "utf8" in msg.lower():
        return MasrError(
            f"{path}: not UTF-8 text ({msg}); if it is Latin-1 / Windows-1252, convert it: "
            f"iconv -f WINDOWS-1252 -t UTF-8 {path.name} > {path.stem}-utf8{path.suffix}"
        )
    return MasrError(f"{path}: {what} ({msg})")


def one_line(exc: BaseException) -> str:
    """An exception's text on one line, at most ~200 characters (for one-line MasrErrors)."""
    text = " ".join(str(exc).split())
    for polars_words, plain in _PLAIN_WORDS.items():
        text = text.replace(polars_words, plain)
    return (text[:200] + "...") if len(text) > 200 else (text or type(exc).__name__)


class _Sha256Thread(threading.Thread):
    """Hash the input bytes while Polars parses them (hashlib and zlib release the GIL); for a
    gzip file also check that every member is complete, since a truncated stream can otherwise
    parse as a shorter file."""

    def __init__(self, path: Path, gz: bool) -> None:
        super().__init__(daemon=True)
        self.path, self.gz = path, gz
        self.digest = ""
        self.gzip_error: str | None = None

    def run(self) -> None:
        if self.path.is_dir():  # the parts: their names and bytes, in name order
            h = hashlib.sha256()
            try:
                for part in input_parts(self.path):
                    h.update(part.relative_to(self.path).as_posix().encode() + b"\0")
                    with open(part, "rb") as fh:
                        while chunk := fh.read(1 << 22):
                            h.update(chunk)
                self.digest = h.hexdigest()
            except OSError:  # reported by the reader too
                pass
            return
        h = hashlib.sha256()
        inflate = zlib.decompressobj(wbits=31) if self.gz else None
        try:
            with open(self.path, "rb") as fh:
                while chunk := fh.read(1 << 22):
                    h.update(chunk)
                    while inflate is not None and chunk:
                        inflate.decompress(chunk, 0)
                        if inflate.eof:  # a member ended: more members may follow
                            chunk = inflate.unused_data
                            inflate = zlib.decompressobj(wbits=31) if chunk.strip(b"\0") else None
                        else:
                            chunk = b""
                            # drop produced output; only integrity matters here
            self.digest = h.hexdigest()
            if inflate is not None and not inflate.eof:
                self.gzip_error = "gzip stream ends early"
        except zlib.error as exc:
            self.gzip_error = f"corrupt gzip data: {exc}"
        except OSError:  # reported by the reader too
            pass


def json_parts(path: Path) -> list[Path]:
    """The JSON files of a directory (the Million Playlist Dataset's ``data/`` folder of
    ``mpd.slice.*.json``), plain or gzipped, in name order."""
    return sorted(
        p
        for p in path.iterdir()
        if p.is_file() and p.name.lower().endswith((".json", ".json.gz")) and p.name[0] not in "._"
    )


def input_parts(path: Path) -> list[Path]:
    """The files an input is read from: itself, or a directory's parts."""
    if not path.is_dir():
        return [path]
    return parquet_parts(path) or json_parts(path)


def parquet_parts(path: Path) -> list[Path]:
    """The Parquet files of a table written as a directory of parts (Spark, Hive, Dask, Polars:
    ``part-00000-….parquet``, also in ``key=value`` partition folders), in name order; the
    bookkeeping files those tools leave beside them (``_SUCCESS``, ``.crc``, ``_metadata``)
    are not parts."""
    return sorted(
        p
        for p in path.rglob("*")
        if p.suffix.lower() in (".parquet", ".pq")
        and p.is_file()
        and not any(n.startswith(("_", ".")) for n in p.relative_to(path).parts)
    )


#: names of data files that a directory of Parquet parts should not hold beside them
_OTHER_DATA = (".csv", ".tsv", ".tab", ".txt", ".json", ".gz")


def _other_data_files(path: Path) -> list[Path]:
    """CSV, TSV, JSON or gzipped files in ``path`` beside its Parquet parts (not the
    bookkeeping files tools leave there, whose names start with ``_`` or ``.``)."""
    return sorted(
        p
        for p in path.rglob("*")
        if p.suffix.lower() in _OTHER_DATA
        and p.is_file()
        and not any(n.startswith(("_", ".")) for n in p.relative_to(path).parts)
    )


def check_file(path: Path) -> bytes:
    """Fail with one line when ``path`` is not a readable, non-empty file (or a directory of
    Parquet parts or MPD JSON slices); return its head (a directory: the Parquet magic bytes;
    ``detect_format`` tells a directory's kind from its parts)."""
    if not path.exists():
        raise MasrError(f"{path}: no such file")
    if path.is_dir():
        parts = parquet_parts(path)
        if not parts and not json_parts(path):
            raise MasrError(
                f"{path}: is a directory without Parquet parts (*.parquet) or Million Playlist "
                "Dataset slices (*.json); give a CSV, TSV or Parquet file, or a directory of "
                "Parquet parts as Spark writes them"
            )
        others = _other_data_files(path) if parts else []
        if others:  # the parts would be read, the rest silently left out
            raise MasrError(
                f"{path}: a directory of {len(parts)} Parquet part(s) that also holds "
                f"{len(others)} other data file(s) (e.g. {others[0].name}), which would not be "
                "read; give one file, or a directory of Parquet parts only"
            )
        return _PARQUET_MAGIC
    if not path.is_file():  # a named pipe (or <(...)), a device: it cannot be read twice
        raise MasrError(
            f"{path}: not a regular file (a pipe or a device), and the input is read more than "
            "once (its start, then its rows); save it to a file first"
        )
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise MasrError(f"{path}: cannot read ({exc.strerror or one_line(exc)})") from None
    if not head:
        raise MasrError(f"{path}: empty file")
    return head


def scan(path: Path, kind: str, gz: bool, *, empty_playlists: bool = False) -> pl.LazyFrame:
    """A lazy frame over an interaction file of the ``detect_format`` kind; CSV/TSV columns are
    all read as String, so ids stay exactly as written (``masr prep`` and ``masr score``), with
    the quoting ``quote_char`` finds."""
    if kind == "json":
        return mpd_json(path, empty_playlists=empty_playlists)
    if kind == "parquet":
        if gz:
            raise MasrError(f"{path}: gzipped Parquet is not supported; decompress it first")
        if path.is_dir():  # key=value folders become columns, as the writer meant them
            return _scan_parts(path)
        return pl.scan_parquet(path)
    return _without_blank_rows(_scan_text(path, kind, quote_char(path, kind)))


def _scan_parts(path: Path) -> pl.LazyFrame:
    """A directory of Parquet parts as one frame. Parts written at different times or by
    different jobs may disagree on a column's type (ids as Int32 in one part and Int64 in
    another, integers beside floats where pandas met a missing value, numbers beside text) or
    on which columns there are (a column added later): polars reads the parts against the
    first one's schema and fails on them. Then each part is read alone, a column whose type
    differs between parts is read as text as ids are (``_id_text``: a float's whole numbers
    without their ".0"), a column missing from a part is empty there, and the parts are joined."""
    parts = parquet_parts(path)
    try:
        schemas = [dict(pl.read_parquet_schema(p)) for p in parts]
    except Exception as exc:  # polars raises several error types for a damaged part
        raise unreadable(path, exc, "unreadable or truncated file") from None
    if all(s == schemas[0] for s in schemas):
        return pl.scan_parquet(parts, hive_partitioning=True)
    types: dict[str, set[pl.DataType]] = {}
    for schema in schemas:
        for name, dtype in schema.items():
            types.setdefault(name, set()).add(dtype)
    mixed = {name for name, kinds in types.items() if len(kinds) > 1}
    frames = []
    for part, schema in zip(parts, schemas, strict=True):
        keys = [n.split("=", 1) for n in part.relative_to(path).parent.parts if "=" in n]
        lf = pl.scan_parquet(part).with_columns(
            pl.lit(value).alias(key) for key, value in keys if key not in schema
        )
        cast = [
            _id_text(pl.col(n), schema[n]).alias(n)
            for n in mixed
            if n in schema and not isinstance(schema[n], (pl.List, pl.Array, pl.Struct))
        ]
        frames.append(lf.with_columns(cast) if cast else lf)
    return pl.concat(frames, how="diagonal_relaxed")


#: the field separator of each text kind ``detect_format`` tells apart
_SEPARATORS = {"csv": ",", "tsv": "\t", "csv-semicolon": ";", "csv-pipe": "|"}


#: what JSON input must be, said when it is not
_MPD_LAYOUT = (
    "JSON input is read in the Million Playlist Dataset's layout "
    '({"playlists": [{"pid": ..., "tracks": [{"track_uri": ..., "pos": ...}]}]}); give other '
    "data (a list of records, one record per line) as CSV, TSV or Parquet"
)


def mpd_json(path: Path, *, empty_playlists: bool = False) -> pl.LazyFrame:
    """Million Playlist Dataset slices (a ``.json`` file, plain or gzipped, or a directory of
    them): ``{"playlists": [{"pid", "tracks": [{"pos", "track_uri", ...}, ...], ...}, ...]}`` as
    one row per song with the columns masr reads by default: ``user_id`` (the ``pid``: MPD has
    no users, so each playlist is its own), ``playlist_id`` (``pid``), ``track_id``
    (``track_uri``) and ``position`` (``pos``), and the tracks' ``track_name`` and
    ``artist_name`` (their other fields are not kept: the whole MPD is 66M rows). Playlists
    without tracks (the challenge set's title-only ones) have no rows, or with
    ``empty_playlists`` (``masr score``) one row without a track, so that they are continued
    too (from popularity). Read whole (JSON does not stream)."""
    frames = []
    first_part: dict[str, Path] = {}  # pid -> the slice it was first read from
    for part in input_parts(path):
        data = part.read_bytes()
        try:
            if data[:2] == _GZIP_MAGIC:
                data = zlib.decompress(data, wbits=31)
            df = pl.read_json(io.BytesIO(data))
        except Exception as exc:  # zlib and polars raise several error types
            # e.g. one record per line (NDJSON): not the layout, whatever the parser says
            raise MasrError(f"{part}: unreadable JSON ({one_line(exc)}); {_MPD_LAYOUT}") from None
        if _empty_slice(df):  # {"playlists": []}: in the layout, with nothing in it
            continue
        playlist = _struct_fields(df.schema.get("playlists"))
        track = _struct_fields(playlist.get("tracks"))
        if "pid" not in playlist or "track_uri" not in track:
            raise MasrError(f"{part}: {_MPD_LAYOUT}")
        lists = df.select(pl.col("playlists").explode()).unnest("playlists")
        lists = lists.select("pid", "tracks").with_row_index("_order")
        _check_pids(lists["pid"].cast(pl.String), part, first_part)
        # (an empty list explodes to a null row in polars 1, to none in polars 2: drop both)
        rows = lists.explode("tracks").drop_nulls("tracks").unnest("tracks")
        if empty_playlists:  # in the file's order of playlists
            empty = lists.filter(pl.col("tracks").list.len().fill_null(0) == 0)
            rows = pl.concat([rows, empty.drop("tracks")], how="diagonal_relaxed")
            rows = rows.sort("_order", maintain_order=True)
        rows = rows.drop("_order")
        pid = pl.col("pid").cast(pl.String)
        named = [pid.alias("user_id"), pid.alias("playlist_id")]
        named.append(pl.col("track_uri").alias("track_id"))
        if "pos" in track:
            named.append(pl.col("pos").alias("position"))
        named += [pl.col(c) for c in SONG_EXTRAS if c in track]  # the rest is not read
        frames.append(rows.select(named))
    if not frames:
        raise MasrError(f"{path}: no playlists in it (an empty \"playlists\" list)")
    return pl.concat(frames, how="diagonal_relaxed").lazy()


def _check_pids(pids: pl.Series, part: Path, first_part: dict[str, Path]) -> None:
    """One MasrError for a ``pid`` that names two playlists: twice in slice ``part``, or also
    in an earlier slice (``first_part``, updated here). An MPD pid is one playlist's, so a
    repeat is a slice read twice (a copy beside it, plain and gzipped) or slices of two
    datasets, whose playlists would be merged into one without a word."""
    if pids.null_count():
        raise MasrError(f"{part}: {pids.null_count()} playlist(s) without a pid; {_MPD_LAYOUT}")
    repeated = pids.filter(pids.is_duplicated())
    if len(repeated):
        pid = repeated[0]  # the first in the slice's order
        n = int((pids == pid).sum())
        raise MasrError(f"{part}: pid {pid} names {n} playlists; an MPD pid names one")
    for pid in pids.to_list():
        earlier = first_part.setdefault(pid, part)
        if earlier != part:
            raise MasrError(
                f"{part}: pid {pid} is also in {earlier} (the same slice twice, or slices of "
                "two datasets?); an MPD pid names one playlist"
            )


def _empty_slice(df: pl.DataFrame) -> bool:
    """An MPD slice whose ``playlists`` list is empty (its schema says nothing of the layout)."""
    if "playlists" not in df.columns or df.height != 1:
        return False
    column = df["playlists"]
    return isinstance(column.dtype, pl.List) and int(column.list.len().fill_null(0).sum()) == 0


def _struct_fields(dtype: pl.DataType | None) -> dict[str, pl.DataType]:
    """The fields of a list of structs (``{}`` for anything else)."""
    if isinstance(dtype, pl.List) and isinstance(dtype.inner, pl.Struct):
        return dict(dtype.inner.to_schema())
    return {}


def _scan_text(path: Path, kind: str, quote: str | None) -> pl.LazyFrame:
    return pl.scan_csv(path, separator=_SEPARATORS[kind], infer_schema=False, quote_char=quote)


def _without_blank_rows(lf: pl.LazyFrame) -> pl.LazyFrame:
    """A CSV/TSV file's rows (every column a String) without its blank ones: an empty line (a
    trailing newline too many, a gap) or a row of separators only (``,,`` from a spreadsheet)
    holds no interaction, so it is skipped rather than read as empty ids. (Data row numbers in
    later error lines count the rows kept.) Applied where the rows are read, not in the quoting
    probe, which only parses."""
    blank = pl.all_horizontal(pl.all().is_null() | (pl.all().str.strip_chars() == ""))
    return lf.filter(~blank)


def quote_char(path: Path, kind: str) -> str | None:
    """``_quote_char`` for the file as it is now: decided once per version of the file (size
    and modification time), since ``masr score`` scans its input to check it, then to read it."""
    stat = Path(path).stat()
    return _quote_char(Path(path).resolve(), kind, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _quote_char(path: Path, kind: str, size: int, mtime_ns: int) -> str | None:
    """How a CSV/TSV file quotes: '"' (RFC 4180: a field that starts with a double quote may
    hold separators, newlines and doubled quotes), or None when the file's double quotes are
    plain text inside unquoted fields (``Don't Stop "Believin"``, as database and shell
    exports write them, and as TSV defines them), which a quote-aware parse rejects as
    malformed. Decided by one quote-aware pass over the file (every column parsed; a count
    alone would not notice). A CSV that needs quoting in one place and has such quotes in
    another cannot be read either way: one error line. ``size`` and ``mtime_ns`` only key the
    cache."""
    probe = _scan_text(path, kind, '"').select(pl.all().str.len_bytes().sum())
    try:
        probe.collect(engine="streaming")
        return '"'
    except Exception as exc:  # polars raises several error types for malformed files
        words = str(exc)
        # in TSV a field that starts with a quote it does not close ("Heroes" (Live)) is
        # plain text too; in a CSV, a quote left open is reported by the read
        quoting = "malformed" in words or (kind == "tsv" and "not properly escaped" in words)
        if not isinstance(exc, pl.exceptions.ComputeError) or not quoting:
            return '"'  # another problem (not UTF-8, no data ...): the read reports it
    if kind != "tsv":
        plain = _scan_text(path, kind, None)
        try:
            quoted = plain.select(pl.any_horizontal(pl.all().str.starts_with('"')).any())
            mixed = bool(quoted.collect(engine="streaming").item())
        except pl.exceptions.PolarsError:
            mixed = True  # e.g. a quoted field that holds the separator: more fields than named
        if mixed:
            raise MasrError(
                f"{path}: malformed CSV: it quotes some fields and has double quotes inside "
                "unquoted ones elsewhere; quote every field that holds a double quote (and "
                "double that quote), or write the file as TSV"
            )
    return None


def id_columns(
    path: str | Path, schema: list[str] | pl.Schema, wanted: dict[str, str]
) -> list[pl.Expr]:
    """The expressions selecting ``wanted`` ({"user": column name, ...}) from a file with the
    columns of ``schema`` (names, or a Schema: float ids then lose a whole number's ".0") as
    Strings named user, playlist, track; a MasrError naming the missing columns, what
    the file has and the ``--*-col`` options to use instead."""
    names = list(schema)
    found = {k: column_named(names, v) for k, v in wanted.items()}
    for column in found.values():  # polars names a repeated header column NAME_duplicated_0
        if column is not None and f"{column}_duplicated_0" in names:
            raise MasrError(
                f"{path}: the header names column {column!r} twice; rename one of them"
            )
    for key, name in wanted.items():
        near = _same_but_case(names, name)
        if found[key] is None and len(near) > 1:
            raise MasrError(
                f"{path}: --{key}-col {name!r} is ambiguous: the file has "
                f"{' and '.join(repr(n) for n in near)}; give one exactly"
            )
    missing = [v for k, v in wanted.items() if found[k] is None]
    if missing:
        option = {v: k for k, v in wanted.items()}
        hint = ", ".join(f"--{option[m]}-col" for m in missing)
        if wanted.get("user") in missing and wanted.get("playlist") in names:
            # perhaps no user column at all, as in MPD: every playlist its own user
            hint += f" (none in the file: --user-col {wanted['playlist']}, one user per playlist)"
        raise MasrError(
            f"{path}: missing column{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(m) for m in missing)} "
            f"(found: {_found(names)}); name the right one with {hint}"
        )
    for role in ("user", "playlist"):  # MPD's user = playlist is fine; the songs are not
        if role in found and found.get("track") == found[role]:
            raise MasrError(
                f"{path}: --track-col {wanted['track']!r}: also the {role} column "
                f"(--{role}-col {wanted[role]!r}); the songs need a column of their own"
            )
    dtypes = schema if isinstance(schema, pl.Schema) else {}
    for key, column in found.items():  # a record has no one text to be an id ('{"t0"}')
        if isinstance(dtypes.get(column), (pl.Struct, pl.Object)):
            raise MasrError(
                f"{path}: id column {column!r} (--{key}-col) holds records (structs), not one "
                "id per row; name the column with the ids, or flatten it first"
            )
    return [_id_text(pl.col(c), dtypes.get(c)).alias(k) for k, c in found.items()]


def one_row_per_song(
    lf: pl.LazyFrame,
    schema: pl.Schema,
    path: str | Path,
    wanted: dict[str, str],
    position: str | None = None,
) -> tuple[pl.LazyFrame, pl.Schema]:
    """A Parquet table with one row per playlist and its songs in a list column (the track
    column a List or Array) as one row per song, in list order, with the lists that go with it
    song by song unnested beside it (the ``position`` column, default "position", and the
    track and artist names); other list columns are dropped. The frame and its new schema. A
    list of users or playlists is a MasrError."""
    names = schema.names()
    found = {k: column_named(names, v) for k, v in wanted.items()}
    lists = [n for n in names if isinstance(schema[n], (pl.List, pl.Array))]
    if found.get("track") not in lists:
        for key in ("user", "playlist"):
            if found.get(key) in lists:
                raise MasrError(
                    f"{path}: column {found[key]!r} holds lists; masr reads one {key} per row "
                    "(a list column is read for the tracks only)"
                )
        return lf, schema
    if any(found.get(k) in lists for k in ("user", "playlist")):
        raise MasrError(f"{path}: the user and playlist columns must hold one id per row")
    # the tracks, and the lists that go with them song by song (positions, names); other list
    # columns (a playlist's tags, say) are not read
    per_song = {found["track"], column_named(names, position or POSITION), *SONG_EXTRAS}
    explode = [n for n in lists if n in per_song]
    lf = lf.drop([n for n in lists if n not in per_song]).explode(explode)
    return lf, lf.collect_schema()


def column_named(names: list[str], name: str) -> str | None:
    """The column of ``names`` that ``name`` means: itself, else the one column that equals it
    but for letter case and surrounding spaces (``User_ID``, `` track_id `` as spreadsheets and
    hand-edited headers write them); None when there is none, or several."""
    if name in names:
        return name
    near = _same_but_case(names, name)
    return near[0] if len(near) == 1 else None


def _same_but_case(names: list[str], name: str) -> list[str]:
    """The columns of ``names`` equal to ``name`` but for letter case and surrounding spaces."""
    key = name.strip().casefold()
    return [n for n in names if n.strip().casefold() == key]


def _id_text(col: pl.Expr, dtype: pl.DataType | None) -> pl.Expr:
    """An id column as String, without the spaces and tabs around it (``u1, p1, t1`` as hand-
    written files have it names the ids of ``u1,p1,t1``); a float column's whole numbers
    without their ".0" (ids written as floats, e.g. by pandas with missing values, are the
    integers they hold)."""
    if dtype is None or not dtype.is_float():
        text = col.cast(pl.String)
        return text if dtype is not None and dtype.is_integer() else text.str.strip_chars(" \t")
    whole = col.is_finite() & (col == col.floor()) & (col.abs() < 2.0**63)
    return (
        pl.when(whole)
        .then(col.cast(pl.Int64, strict=False).cast(pl.String))
        .otherwise(col.cast(pl.String))
    )


def read_interactions(
    path: str | Path,
    columns: Columns | None = None,
    *,
    extras_apart: bool = False,
    head: bytes | None = None,
) -> RawInput:
    """Read ``path`` and return its id columns (renamed to user/playlist/track) and extras.

    ``extras_apart``: the extras (track and artist names, two long strings per row, most of a
    large input's memory) are read by a second, streaming query that keeps one row per track,
    into :attr:`RawInput.song_extras`, so they never exist per row in memory. ``head``: what
    ``check_file(path)`` returned, when the caller checked the file already (not read again).
    """
    columns = columns or Columns()
    path = Path(path)
    head = check_file(path) if head is None else head  # ``head``: what check_file returned
    kind, gz = detect_format(path, head)
    hasher = _Sha256Thread(path, gz)
    hasher.start()
    wanted = columns.as_dict()
    try:
        lf = scan(path, kind, gz)
        lf, schema = one_row_per_song(lf, lf.collect_schema(), path, wanted, columns.position)
        names = schema.names()
        select = id_columns(path, schema, wanted)
        taken = {column_named(names, v) for v in wanted.values()}
        position = _position_column(path, names, columns.position, taken)
        if position is not None:
            select.append(pl.col(position).alias(POSITION))
        extras = [  # without the spaces around them, as the ids (``u1, p1, t1, Name``)
            _id_text(pl.col(c), None).alias(e)
            for e in SONG_EXTRAS
            if (c := column_named(names, e)) is not None and c not in taken
        ]
        song_extras = None
        if extras and extras_apart:
            track = column_named(names, wanted["track"])
            song_extras = (
                lf.select(
                    # the key exactly as id_columns reads the track ids, or no name would match
                    _id_text(pl.col(track), schema[track]).alias("track"),
                    *extras,
                )
                .unique(subset="track", keep="first", maintain_order=True)
                .collect(engine="streaming")
            )
        else:
            select += extras
        frame = lf.select(select).collect()
    except MasrError:
        raise
    except pl.exceptions.NoDataError:
        raise MasrError(f"{path}: empty file (no header or data)") from None
    except Exception as exc:  # polars raises several error types for malformed files
        raise unreadable(path, exc, "unreadable or truncated file") from None
    finally:
        hasher.join()

    if hasher.gzip_error:
        raise MasrError(f"{path}: unreadable or truncated file ({hasher.gzip_error})")
    if frame.height == 0:
        raise MasrError(f"{path}: no data rows (only a header)")
    if POSITION in frame.columns:
        frame = _positions(frame, path, position or POSITION)
    _check_ids(frame, path, wanted)
    return RawInput(
        frame=frame,
        path=str(path),
        format=kind + ("+gzip" if gz else ""),
        rows=frame.height,
        checksum=hasher.digest,
        song_extras=song_extras,
    )


def _found(names: list[str]) -> str:
    """A file's first column names, for an error line."""
    return ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")


def _position_column(
    path: Path, names: list[str], given: str | None, taken: set[str]
) -> str | None:
    """The input column that orders a playlist's songs: ``given`` (``--position-col``, then
    required), else ``position`` when the file has one that is not an id column."""
    if given is None:
        found = column_named(names, POSITION)
        return found if found is not None and found not in taken else None
    given = column_named(names, given) or given
    if given not in names:
        raise MasrError(
            f"{path}: missing column {given!r} (found: {_found(names)}); name the song-order "
            "column with --position-col, or leave the option out to use the input's row order"
        )
    if given in taken:
        raise MasrError(f"{path}: --position-col {given!r} is also an id column; name another")
    return given


def _positions(frame: pl.DataFrame, path: Path, name: str) -> pl.DataFrame:
    """The order column as Int64, order kept: integers as they are; dates and datetimes as
    microseconds since the epoch (one unit whatever the input's); whole floats as integers,
    other floats by rank (only the order within a playlist is used); text holding integers,
    ISO dates or datetimes, or numbers likewise. Anything else is one error line naming the
    value."""
    col = frame[POSITION]
    if col.dtype == pl.UInt64 and (col.max() or 0) >= 2**63:  # beyond Int64: by rank, exact
        out = col.rank("dense").cast(pl.Int64)
    elif col.dtype.is_integer():
        out = col.cast(pl.Int64)
    elif col.dtype == pl.Date or isinstance(col.dtype, pl.Datetime):
        # one unit whatever the input's (days, ms, ns): microseconds, as text dates are read
        out = col.cast(pl.Datetime("us")).cast(pl.Int64)
    elif col.dtype.is_temporal():  # a time of day or a duration: its own count
        out = col.cast(pl.Int64)
    elif col.dtype.is_float():
        out = _float_order(col)
    elif col.dtype.is_nested() or col.dtype == pl.Object:  # no text of one value to read
        kind = "lists" if isinstance(col.dtype, (pl.List, pl.Array)) else "records (structs)"
        raise MasrError(
            f"{path}: song-order column {name!r} holds {kind}, not an integer, number, date or "
            "datetime per row (a list goes with a list of tracks); name another with "
            "--position-col, or drop the column"
        )
    else:
        out = _text_order(col.cast(pl.String), path, name)
    return frame.with_columns(out.alias(POSITION))


def _float_order(col: pl.Series) -> pl.Series:
    """Whole finite floats as Int64; otherwise the dense rank (NaN as missing)."""
    col = col.fill_nan(None)
    finite = col.drop_nulls()
    if (
        finite.is_finite().all()
        and (finite == finite.floor()).all()
        and (finite.abs() < 2.0**63).all()
    ):
        return col.cast(pl.Int64)
    return col.rank("dense").cast(pl.Int64)


def _text_order(text: pl.Series, path: Path, name: str) -> pl.Series:
    """Text positions: integers, else ISO dates/datetimes, else numbers; blanks and a database
    export's NULL (``\\N``) are missing."""
    text = text.str.strip_chars()
    missing = (text == "") | (text == NULL_MARK)
    text = pl.select(pl.when(missing).then(None).otherwise(text)).to_series()
    given = text.is_not_null()
    as_int = text.cast(pl.Int64, strict=False)
    if not (as_int.is_null() & given).any():
        return as_int
    if (text.str.contains(r"^[+-]?\d+$") | ~given).all():  # integers beyond Int64: exact order
        exact = text.cast(pl.Decimal(38, 0), strict=False)  # (as floats they would tie)
        if not (exact.is_null() & given).any():
            return exact.rank("dense").cast(pl.Int64)
    try:
        as_time = text.str.to_datetime(strict=False, time_unit="us")
    except Exception:  # noqa: BLE001 - polars raises several types when no format is inferred
        as_time = None
    if as_time is not None and not (as_time.is_null() & given).any():
        return as_time.cast(pl.Int64)
    as_float = text.cast(pl.Float64, strict=False)
    bad = as_float.is_null() & given
    if not bad.any():
        return _float_order(as_float)
    numeric = as_float.is_not_null()
    timed = pl.repeat(False, len(text), eager=True) if as_time is None else as_time.is_not_null()
    if numeric.any() and timed.any() and not (given & ~numeric & ~timed).any():
        row, other = int(timed.arg_true()[0]), int(numeric.arg_true()[0])
        raise MasrError(
            f"{path}: song-order column {name!r} mixes dates ({text[row]!r}, data row {row + 1}) "
            f"and numbers ({text[other]!r}, data row {other + 1}); use one kind throughout, name "
            "another with --position-col, or drop the column"
        )
    if timed.sum() > numeric.sum():  # mostly dates: name the first value that is not one
        row, like = int((given & ~timed).arg_true()[0]), int(timed.arg_true()[0])
        raise MasrError(
            f"{path}: song-order column {name!r} holds {text[row]!r} (data row {row + 1}), not "
            f"a date or datetime in the form of the others (e.g. {text[like]!r}, data row "
            f"{like + 1}: one form throughout); fix it, name another "
            "with --position-col, or drop the column"
        )
    row = int(bad.arg_true()[0])
    raise MasrError(
        f"{path}: song-order column {name!r} holds {text[row]!r} (data row {row + 1}), not an "
        "integer, number, date or datetime; fix it, name another with --position-col, or drop "
        "the column"
    )


def _check_ids(frame: pl.DataFrame, path: Path, wanted: dict[str, str]) -> None:
    """Null or blank ids are an error, and so is a database export's NULL mark ``\\N``:
    naming the column and the first bad data row (blank ones said first)."""
    ids = frame.select(pl.col(k).str.strip_chars() for k in wanted)  # stripped once
    blank = ids.select((pl.col(k).is_null() | (pl.col(k) == "")).alias(k) for k in wanted)
    marked = ids.select((pl.col(k) == NULL_MARK).alias(k) for k in wanted)
    for flags, what, advice in (
        (blank, "an empty", ""),
        (marked, f"{NULL_MARK} (a database export's NULL) as", "; drop those rows first"),
    ):
        for (key, name), n in zip(wanted.items(), flags.sum().row(0), strict=True):
            if n:
                row = int(flags[key].arg_true()[0])
                raise MasrError(
                    f"{path}: {n} row(s) have {what} {name!r} (first at data row {row + 1})"
                    + advice
                )
