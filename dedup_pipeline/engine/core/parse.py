"""Read one landing hour into typed rows; anything that does not parse is rejected with a reason.

docs/design.md R1, R9. Untrusted input is read as text and cast with `try_cast` (Spark 4's ANSI mode would
otherwise raise on a bad value and stop the load). Every row keeps its origin
(`_source_file`, and `_blk`/`_rid`, which order rows exactly as they stand in the file, whatever
the file splitting) and its original text in `_raw`.

Which files are read (every rule: docs/design.md, "Reading landing files"):
the regular files directly in the hour's directory whose names do not start with `.` or `_`
(markers, hidden and temporary files) nor end like a file still being written (`._COPYING_`,
`.tmp`, ...: `is_data_name`); subdirectories are never read. Every name Spark's file index would
skip is excluded, so Spark reads exactly the listed files. Each listed file is read
exactly once, whatever its name holds: names are escaped for Hadoop's glob syntax, local files are
read through Hadoop's raw local file system (its checksum wrapper cannot open a name with a `:`),
and `_source_file` is the path exactly as `list_input_files` lists it (and the commit record's
`inputs` record it).

Reject reasons (short codes, in order of precedence):
  unreadable_file     the whole file cannot be read as its format (not gzip, truncated, not
                      Parquet, a compression not read, a dangling link, vanished, no
                      permission); one row per file, `_raw` says why
  bad_encoding        the record's bytes are not valid UTF-8; `_raw` is the base64 of its bytes
  malformed           the line/record does not parse (bad JSON, not an object, wrong CSV field count)
  bad_value:<col>     a non-empty value that does not cast to the column's declared type
  null_key            a key column is null (missing, JSON null, or an empty CSV field)
  unknown_category    a categorical expiry value not in the declared categories
  bad_expiry_value    the expiry value is null or does not cast
"""

from __future__ import annotations

import bz2
import errno
import gzip
import os
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import BinaryIO
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.types import _parse_datatype_json_string

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core.columns import BLOCK, RAW, REASON, ROW, SOURCE_FILE, V
from dedup_pipeline.engine.core.commits import InputFile
from dedup_pipeline.engine.core.expiry import expiry_value
from dedup_pipeline.engine.core.storage import Storage, glob_escape, is_hidden
from dedup_pipeline.errors import UserError
from dedup_pipeline.hours import landing_dir

SPARK_TYPES: dict[str, T.DataType] = {
    "string": T.StringType(),
    "long": T.LongType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
    "timestamp": T.TimestampType(),
    "date": T.DateType(),
}
CORRUPT = "_corrupt_record"
PRE = "_read_reason"  # a reason decided while reading (unreadable_file, bad_encoding)
MISMATCHED = "_mismatched"  # Parquet: the declared columns whose value is of another kind
UNREADABLE = "unreadable_file"
BAD_ENCODING = "bad_encoding"
META_COLS = [SOURCE_FILE, BLOCK, ROW, RAW]
# Hadoop's checksum wrapper of the local file system builds a `.name.crc` Path from the leaf name,
# which fails on a `:` (URISyntaxException); the raw local file system reads the file itself.
READ_OPTIONS = {"fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
                "fs.file.impl.disable.cache": "true"}
_OBJECT_STORES = ("s3", "s3a", "s3n", "gs", "gcs", "abfs", "abfss", "az", "adl", "wasb", "wasbs")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Unreadable:
    """A landing file that cannot be read as its format: one `unreadable_file` row."""

    path: str
    error: str


@dataclass(frozen=True)
class BatchPlan:
    """What to read of one hour: readable files (Parquet ones grouped by physical schema)."""

    files: tuple[InputFile, ...]
    unreadable: tuple[Unreadable, ...] = ()
    parquet_groups: tuple[tuple[str, ...], ...] = ()
    base: str = ""  # the hour directory as listed: every `_source_file` is base/<name>

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    def without(self, bad: Unreadable) -> BatchPlan:
        """This plan with one more file set aside as unreadable (a read failed on it)."""
        files = tuple(f for f in self.files if f.path != bad.path)
        groups = tuple(g for g in (tuple(p for p in grp if p != bad.path)
                                   for grp in self.parquet_groups) if g)
        return replace(self, files=files, unreadable=(*self.unreadable, bad),
                       parquet_groups=groups)


class LandingMissingError(UserError, RuntimeError):
    """The dataset's landing root does not exist: a config or mount problem, not an empty hour."""

    stage = "the landing check (the landing root is missing)"
    fix = ("fix source.path in the config or mount the landing zone, then rerun {hours}; nothing was "
           "written")


def hour_dir(ds: DatasetConfig, hour: datetime) -> str:
    return landing_dir(ds.source.path, hour)


def check_landing_root(ds: DatasetConfig) -> None:
    """Fail the load if `source.path` does not exist (a missing hour directory is a 0-row hour).

    Object stores have no directories (an empty prefix does not exist), so there it is not checked.
    """
    st = Storage(ds.source.path)
    protocol = st.fs.protocol if isinstance(st.fs.protocol, str) else st.fs.protocol[0]
    if protocol in _OBJECT_STORES:
        return
    if not st.fs.isdir(st.root):
        what = "is not a directory" if st.exists(st.root) else "does not exist"
        raise LandingMissingError(
            f"dataset {ds.name!r}: landing path {ds.source.path} (source.path) {what}; "
            "fix the config or mount the landing zone (an hour with no files needs only its root)")


def list_input_files(ds: DatasetConfig, hour: datetime) -> list[InputFile]:
    """The hour's data files; [] if the hour's directory is absent.

    Data files are the regular files directly in the directory whose names do not start with
    `.` or `_` (markers such as `_SUCCESS`, hidden and temporary files); subdirectories
    (`_temporary/`, `.hidden/`, any other) are not read. Paths are plain on a local file
    system, full URIs (the source's own scheme and authority) elsewhere.
    """
    st = Storage(hour_dir(ds, hour))
    if st.exists(st.root) and not st.fs.isdir(st.root):
        raise LandingMissingError(
            f"dataset {ds.name!r}: hour path {st.to_uri(st.root)} is a file, not a directory; "
            "move it into the hour's directory (date=YYYY-MM-DD/hour=HH/<name>)")
    try:
        entries = st.fs.ls(st.root, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for e in entries:
        name = os.path.basename(str(e["name"]).rstrip("/"))
        if not is_data_name(name):
            continue
        if e.get("type") != "file":
            # a symbolic link to a regular file is that file (a link to a directory is not)
            if not e.get("islink"):
                continue
            try:
                target = st.fs.info(e["name"])  # the target's type, size and time
            except OSError:  # dangling, a loop, or not ours to see: `plan_batch` says which
                out.append(InputFile(path=st.to_uri(str(e["name"])), size=0, mtime=0.0))
                continue
            if target.get("type") != "file":
                continue
            e = {**target, "name": e["name"]}
        out.append(InputFile(path=st.to_uri(str(e["name"])), size=int(e.get("size") or 0),
                             mtime=float(e.get("mtime") or 0.0)))
    return sorted(out, key=lambda f: f.path)


# Names a writer gives a file it has not finished (`hdfs dfs -put`'s `._COPYING_`, `.tmp`, Flink's
# `.inprogress`, download managers' `.part`/`.partial`): not data yet, never read (compared
# case-insensitively). When the writer renames the file, it is a new file of its hour.
IN_PROGRESS_SUFFIXES = ("._copying_", ".tmp", ".temp", ".inprogress", ".in-progress", ".partial",
                        ".part", ".filepart", ".crdownload", ".uploading")


def is_data_name(name: str) -> bool:
    """Is a file of this name a data file (docs/design.md, "Reading landing files")?

    Not a marker, hidden or temporary file (`_`, `.` prefix) and not an in-progress name. Every
    name Spark's file index would skip is excluded here too (`spark_skips`), so the files a load
    lists are exactly the files Spark reads.
    """
    return not is_hidden(name) and not name.lower().endswith(IN_PROGRESS_SUFFIXES)


def spark_skips(name: str) -> bool:
    """Spark's own filter on data file names (`HadoopFSUtils.shouldFilterOutPathName`, Spark 4):
    it skips these even when given the file's explicit path."""
    exclude = ((name.startswith("_") and "=" not in name) or name.startswith(".")
               or name.endswith("._COPYING_"))
    return exclude and not name.startswith(("_common_metadata", "_metadata"))


def spark_path(path: str) -> str:
    """`path` as a Hadoop glob that matches only itself (`[`, `*`, `{`... escaped)."""
    return glob_escape(path)


def _check_stream(fh: object, opener: object) -> None:
    with opener(fh) as z:  # type: ignore[operator]
        while z.read(_CHUNK):
            pass


def _check_zlib(fh: BinaryIO) -> None:
    """Hadoop's `.deflate` (DeflateCodec): zlib streams one after another, nothing else after."""
    z, pending = zlib.decompressobj(), False
    while chunk := fh.read(_CHUNK):
        while chunk:
            z.decompress(chunk, _CHUNK)
            pending = True
            if z.eof:
                chunk, z, pending = z.unused_data, zlib.decompressobj(), False
            else:
                chunk = z.unconsumed_tail
    if pending:
        z.flush()
        if not z.eof:
            raise EOFError("the last zlib stream is truncated")


def _check_zstd(fh: BinaryIO) -> None:
    with pa.CompressedInputStream(pa.PythonFile(fh, mode="r"), "zstd") as z:
        while z.read(_CHUNK):
            pass


# Hadoop decompresses a file by the exact end of its name (CompressionCodecFactory); these are
# checked by a full decompression pass on the driver before Spark opens them.
CODECS: dict[str, Callable[[BinaryIO], None]] = {
    ".gz": lambda fh: _check_stream(fh, lambda x: gzip.GzipFile(fileobj=x)),
    ".bz2": lambda fh: _check_stream(fh, lambda x: bz2.BZ2File(x)),
    ".zst": _check_zstd,
    ".deflate": _check_zlib,
}
# Hadoop would decompress these with its own block formats, which the lz4 and snappy tools do not
# write (a file from them makes Hadoop read a garbage block length and the JVM runs out of
# memory); the rest Hadoop does not decompress at all (the bytes would load as text). All of them,
# in any case, and a supported codec's name in other than lower case, are `unreadable_file`.
UNSUPPORTED_CODECS = (".lz4", ".snappy", ".xz", ".lzma", ".zip", ".7z", ".br", ".lzo", ".z",
                      ".zstd", ".lz", ".sz", ".tgz")


def _codec_verdict(name: str) -> Callable[[BinaryIO], None] | str | None:
    """The check for a compressed name, a reason it cannot be read, or None (plain text)."""
    for ext, check in CODECS.items():
        if name.endswith(ext):
            return check
        if name.lower().endswith(ext):
            return (f"compressed files are recognised by a lower-case extension: rename it to "
                    f"*{ext} (as written, it would be read as plain text)")
    low = name.lower()
    for ext in UNSUPPORTED_CODECS:
        if low.endswith(ext):
            return (f"{ext} compression is not supported: recompress the file as "
                    f"{', '.join(CODECS)} (or store it uncompressed)")
    return None


def _open_error(e: OSError) -> str:
    why = {errno.ENOENT: "it does not exist (a dangling symbolic link, or removed after listing)",
           errno.ELOOP: "a symbolic link loop",
           errno.EACCES: "permission denied", errno.EPERM: "permission denied",
           errno.EISDIR: "it is a directory"}.get(e.errno or 0)
    return f"cannot open the file: {why or f'{type(e).__name__}: {e}'}"


def _vet(ds: DatasetConfig, st: Storage, f: InputFile) -> tuple[str, ...] | Unreadable | None:
    """Check one file cheaply on the driver: that it opens, its Parquet schema, or a full
    decompression pass.

    Returns the Parquet schema key, an `Unreadable`, or None (a text file that looks fine).
    """
    name = f.path.rsplit("/", 1)[-1]
    try:
        fh = st.fs.open(f.path, "rb")
    except OSError as e:
        return Unreadable(f.path, _open_error(e)[:500])
    codec = None if ds.source.format == "parquet" else _codec_verdict(name)
    try:
        with fh:
            if f.size == 0:
                return None  # an empty file is zero records, whatever its name
            if isinstance(codec, str):
                return Unreadable(f.path, f"not a readable file: {codec}"[:500])
            if ds.source.format == "parquet":
                pf = pq.ParquetFile(fh)
                schema = pf.schema_arrow
                lower = [fld.name.lower() for fld in schema]
                twice = sorted({n for n in lower if lower.count(n) > 1})
                if twice:  # Spark matches names case-insensitively: it cannot read such a file
                    return Unreadable(f.path, "not a readable Parquet file: columns whose names "
                                      f"differ only in case: {', '.join(twice)}"[:500])
                layout = parquet_layout(ds, pf)
                return replace(layout, path=f.path) if isinstance(layout, Unreadable) else layout
            if codec is not None:
                codec(fh)
            else:
                fh.read(1)  # readable at all (a directory, a permission, a vanished file)
    except Exception as e:  # noqa: BLE001 - whatever reading a landing file raises rejects it (R9)
        what = "Parquet" if ds.source.format == "parquet" else name.rsplit(".", 1)[-1]
        return Unreadable(f.path, f"not a readable {what} file: {type(e).__name__}: {e}"[:500])
    return None


def plan_batch(ds: DatasetConfig, files: list[InputFile], base: str = "") -> BatchPlan:
    """Vet the hour's files: empty files hold no records, unreadable ones are set aside."""
    if not files:
        return BatchPlan((), base=base)
    base = base or files[0].path.rsplit("/", 1)[0]
    st = Storage(base)
    keep: list[InputFile] = []
    bad: list[Unreadable] = []
    groups: dict[tuple[str, ...], list[str]] = {}
    for f in files:
        name = f.path.rsplit("/", 1)[-1]
        if spark_skips(name):  # never listed (`is_data_name`); Spark would not read its rows
            raise AssertionError(f"{f.path}: a name Spark's file index skips was listed")
        verdict = _vet(ds, st, f)
        if isinstance(verdict, Unreadable):
            bad.append(verdict)
            continue
        if f.size == 0:
            continue  # an empty file is zero records, whatever its format
        keep.append(f)
        if verdict is not None:
            groups.setdefault(verdict, []).append(f.path)
    return BatchPlan(tuple(keep), tuple(bad), tuple(tuple(g) for g in groups.values()), base)


_FAILED_FILE = re.compile(r"reading file (\S+?)\.?\s+SQLSTATE")
_PATH_NOT_FOUND = re.compile(r"\[PATH_NOT_FOUND\] Path does not exist: (.+?)\.?\s+SQLSTATE")


def failed_file(exc: BaseException, plan: BatchPlan) -> Unreadable | None:
    """The file a Spark read failure names (FAILED_READ_FILE, or PATH_NOT_FOUND: it vanished
    after it was listed and checked), as an `Unreadable`, or None."""
    text = str(exc)
    m = _FAILED_FILE.search(text)
    gone = _PATH_NOT_FOUND.search(text)
    if m is not None:
        name = unquote(m.group(1).rsplit("/", 1)[-1])
    elif gone is not None:  # the glob-escaped path, not URI-quoted
        name = re.sub(r"\\(.)", r"\1", gone.group(1).rsplit("/", 1)[-1])
    else:
        return None
    for f in plan.files:
        if f.path.rsplit("/", 1)[-1] == name:
            if gone is not None and m is None:
                return Unreadable(f.path, "cannot open the file: it does not exist (removed "
                                  "after listing)")
            causes = re.findall(r"Caused by: ([^\n]+)", text)
            why = causes[-1] if causes else text.strip().splitlines()[0]
            return Unreadable(f.path, f"Spark could not read the file: {why}"[:500])
    return None


def _string_schema(ds: DatasetConfig) -> T.StructType:
    fields = [T.StructField(c, T.StringType()) for c in ds.source.schema]
    return T.StructType([*fields, T.StructField(CORRUPT, T.StringType())])


def _source_file(base: str) -> Column:
    """The listed path of a row's file, from Spark's URI form of it.

    Spark gives `file:/dir/a%5B1%5D.jsonl`; every file of a batch is in `base`, so the decoded
    leaf name appended to `base` is exactly the path `list_input_files` listed (`+` is literal
    in a URI path, so it is protected from `url_decode`, which would read it as a space).
    """
    uri = F.replace(F.col("_metadata.file_path"), F.lit("+"), F.lit("%2B"))
    return F.concat(F.lit(base.rstrip("/") + "/"), F.substring_index(F.url_decode(uri), "/", -1))


def _origin(base: str) -> list[Column]:
    return [
        _source_file(base).alias(SOURCE_FILE),
        F.col("_metadata.file_block_start").alias(BLOCK),
        F.monotonically_increasing_id().alias(ROW),
    ]


# A JSON `\uD800`-`\uDFFF` escape that is not half of a surrogate pair: valid JSON text, but not
# a Unicode character (Java would make it `?`, merging distinct keys). An odd run of backslashes
# before the `u` makes it an escape.
_ESC = r"(?<!\\)(?:\\\\)*"
LONE_SURROGATE = (
    _ESC + r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})|"
    + _ESC + r"(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _with_encoding_check(df: DataFrame, ds: DatasetConfig,
                         also: Column | None = None) -> DataFrame:
    """`bad_encoding` for a record whose bytes are not UTF-8 (or `also`: its text is not Unicode);
    its `_raw` becomes the base64 of its bytes."""
    checks = [F.col(RAW), *[F.col(c) for c in ds.source.schema]]
    bad = F.lit(False) if also is None else also
    for c in checks:
        bad = bad | ~F.coalesce(F.is_valid_utf8(c), F.lit(True))
    if MISMATCHED not in df.columns:  # only Parquet values have a kind of their own
        df = df.withColumn(MISMATCHED, F.lit(None).cast("array<string>"))
    return df.withColumns({
        PRE: F.when(bad, F.lit(BAD_ENCODING)),
        RAW: F.when(bad, F.base64(F.col(RAW).cast("binary"))).otherwise(F.col(RAW)),
    })


def _read_jsonl(spark: SparkSession, ds: DatasetConfig, plan: BatchPlan) -> DataFrame:
    paths = [spark_path(p) for p in plan.paths]
    # JSON Lines: a record ends at `\n`; a `\r` before it is part of the line ending (CRLF), a
    # `\r` elsewhere is JSON whitespace or data. (Spark's default also splits lines at a lone `\r`.)
    # The `\r` is cut as bytes, so invalid UTF-8 in the line is kept exactly.
    raw = F.expr("CASE WHEN endswith(value, '\\r') THEN "
                 "cast(substring(cast(value AS binary), 1, octet_length(value) - 1) AS string) "
                 "ELSE value END")
    txt = (spark.read.options(**READ_OPTIONS).option("lineSep", "\n").text(paths)
           .select(raw.alias(RAW), *_origin(plan.base)))
    # blank lines are not records: empty, or only JSON whitespace (space, tab, `\r`)
    txt = txt.filter(F.btrim(F.col(RAW), F.lit(" \t\r")) != "")
    opts = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    # A byte-order mark before a line's JSON is not part of it (`cat a.jsonl b.jsonl` puts one
    # mid-file); `_raw` keeps it.
    body = F.when(F.startswith(F.col(RAW), F.lit("\ufeff")), F.expr(f"substring({RAW}, 2)")
                  ).otherwise(F.col(RAW))
    # Exactly one JSON value on the line: `from_json` reads the first value and ignores what
    # follows (`{..}{..}`, `{..} words`), so the line is parsed as the array `[line]`, which must
    # hold one element. A `]` after the object would close that array early and hide the rest:
    # only a line holding a `]` is parsed once more, as `[line,[]]`, which must hold two.
    arr = F.from_json(F.concat(F.lit("["), body, F.lit("]")),
                      T.ArrayType(_string_schema(ds)), opts)
    # (read with the same parser and options as the record itself: `json_array_length` would
    # refuse a NaN token that `from_json` takes, so a line's verdict would hang on a `]`)
    pair = F.from_json(F.concat(F.lit("["), body, F.lit(",[]]")), T.ArrayType(T.StringType()), opts)
    bracket_ok = F.size(pair) == 2
    one = (F.coalesce(F.size(arr) == 1, F.lit(False))
           & (~F.col(RAW).contains("]") | F.coalesce(bracket_ok, F.lit(False))))
    # `get`, not `arr[0]`: an empty array (a line of only a BOM) is null, never an error
    parsed = txt.select("*", F.get(arr, 0).alias("_j"), one.alias("_one"))
    cols = [F.col(f"_j.{c}").alias(c) for c in ds.source.schema]
    malformed = ~F.col("_one") | F.col(f"_j.{CORRUPT}").isNotNull() | F.col("_j").isNull()
    df = parsed.select(*cols, *META_COLS, malformed.alias("_malformed"))
    # the regex only on lines with a `\u` escape (it cannot match others; `And` skips its right
    # side): run on every line, it doubled the parse of a 1e6-row hour (3.9-4.1 s -> 7.7-7.8 s)
    lone = F.col(RAW).contains("\\u") & F.col(RAW).rlike(LONE_SURROGATE)
    return _with_encoding_check(df, ds, lone)


def _read_csv(spark: SparkSession, ds: DatasetConfig, plan: BatchPlan) -> DataFrame:
    """RFC 4180 records (a quoted field may span lines), bytes kept exactly.

    With an ASCII delimiter the file is decoded as ISO-8859-1 (one char per byte, so quotes and
    delimiters are found exactly as in UTF-8) and each field is turned back into its original
    bytes; invalid UTF-8 is then seen, not replaced by U+FFFD.
    """
    lossless = ds.source.csv.delimiter.isascii()
    reader = (
        spark.read.options(**READ_OPTIONS).schema(_string_schema(ds))
        .option("header", str(ds.source.csv.header).lower())
        .option("sep", ds.source.csv.delimiter)
        .option("escape", '"')  # RFC 4180: a quote inside a quoted field is doubled ("")
        .option("multiLine", "true")
        .option("encoding", "ISO-8859-1" if lossless else "UTF-8")
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .option("enforceSchema", "true")
    )
    df = reader.csv([spark_path(p) for p in plan.paths])

    def original(c: str) -> Column:
        return F.encode(F.col(c), "ISO-8859-1").cast("string") if lossless else F.col(c)

    names = list(ds.source.schema)
    # re-serialized before the bytes are restored: to_csv would mangle invalid UTF-8
    as_text = F.to_csv(F.struct(*[F.col(c) for c in names]),
                       {"sep": ds.source.csv.delimiter, "escape": '"',  # fields as they were:
                        "ignoreLeadingWhiteSpace": "false", "ignoreTrailingWhiteSpace": "false"})
    df = df.select(*names, F.coalesce(F.col(CORRUPT), as_text).alias(RAW),
                   F.col(CORRUPT).isNotNull().alias("_malformed"), *_origin(plan.base))
    df = df.select(*[original(c).alias(c) for c in names], SOURCE_FILE, BLOCK, ROW,
                   original(RAW).alias(RAW), "_malformed")
    return _with_encoding_check(df, ds)


_WIDENS = {
    "long": (T.ByteType, T.ShortType, T.IntegerType, T.LongType),
    "double": (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType),
}


# A Parquet column as the Spark type it is read as (what Spark's own schema inference gives)
_ARROW_INTS = {(8, True): T.ByteType(), (16, True): T.ShortType(), (32, True): T.IntegerType(),
               (64, True): T.LongType(), (8, False): T.ShortType(), (16, False): T.IntegerType(),
               (32, False): T.LongType(), (64, False): T.DecimalType(20, 0)}
NANOS = "nanos"  # an INT64 nanosecond timestamp: read as a long (nanosAsLong), floored to micros
NULL = "null"  # a column of Arrow's null type: every value is null, nothing is read
MISMATCH = "mismatch:"  # + the Spark type it is read as: a value of another kind than declared
Layout = tuple[tuple[str, str, str], ...]  # (declared column, the file's column, how it is read)


def _spark_type(arrow_type: pa.DataType, physical: str) -> T.DataType | str | None:
    """How Spark reads a top-level Parquet scalar column: its type, NANOS, or None (not a scalar
    Spark reads)."""
    t = arrow_type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_timestamp(t):
        if physical == "INT96":  # a legacy timestamp: Spark reads it as a timestamp
            return T.TimestampType()
        if t.unit == "ns":
            return NANOS
        return T.TimestampType() if t.tz is not None else T.TimestampNTZType()
    if pa.types.is_integer(t):
        return _ARROW_INTS[(t.bit_width, pa.types.is_signed_integer(t))]
    simple = [(pa.types.is_boolean, T.BooleanType()), (pa.types.is_float32, T.FloatType()),
              (pa.types.is_float64, T.DoubleType()), (pa.types.is_string, T.StringType()),
              (pa.types.is_large_string, T.StringType()), (pa.types.is_binary, T.BinaryType()),
              (pa.types.is_large_binary, T.BinaryType()),
              (pa.types.is_fixed_size_binary, T.BinaryType()), (pa.types.is_date, T.DateType())]
    for test, typ in simple:
        if test(t):
            return typ
    if pa.types.is_decimal(t) and t.precision <= 38:
        return T.DecimalType(t.precision, t.scale)
    return None  # float16, time32/64, intervals, decimals over 38 digits, nested types


def _nested_type(t: pa.DataType) -> T.DataType | None:
    """The Spark type of a nested Parquet column (struct, list, map), or None if Spark cannot read
    it (a leaf it cannot read, such as float16, anywhere inside)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_struct(t):
        fields = [(t.field(i).name, _nested_type(t.field(i).type)) for i in range(t.num_fields)]
        if not fields or any(f is None for _, f in fields):
            return None
        return T.StructType([T.StructField(n, f) for n, f in fields])  # type: ignore[arg-type]
    if pa.types.is_map(t):
        k, v = _nested_type(t.key_type), _nested_type(t.item_type)
        return None if k is None or v is None else T.MapType(k, v)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        e = _nested_type(t.value_type)
        return None if e is None else T.ArrayType(e)
    if pa.types.is_null(t):
        return T.NullType()
    if pa.types.is_duration(t):  # Spark reads a duration as its count of units
        return T.LongType()
    leaf = _spark_type(t, "")
    return None if leaf is None or leaf == NANOS else leaf  # type: ignore[return-value]


_KINDS: dict[str, tuple[type, ...]] = {
    "string": (T.BooleanType,), "long": (), "double": (T.FloatType, T.DoubleType),
    "boolean": (T.BooleanType,), "timestamp": (T.TimestampType, T.TimestampNTZType),
    "date": (T.DateType,)}


def _fits(declared: str, typ: T.DataType) -> bool:
    """Does a Parquet value of Spark type `typ` hold a value of the declared type (docs/design.md
    R9a: Parquet values are typed)? Text, binary and decimals always go through `try_cast`, as
    text does; integers fit string, long and double."""
    if isinstance(typ, T.StringType | T.BinaryType | T.DecimalType):
        return True
    if isinstance(typ, _WIDENS["long"]):
        return declared in ("string", "long", "double")
    return isinstance(typ, _KINDS[declared])


def parquet_layout(ds: DatasetConfig, pf: pq.ParquetFile) -> Layout | Unreadable:
    """Which of the file's columns are read, and as what: only the declared ones, so a column
    outside the schema is never looked at, whatever its type."""
    physical = {pf.schema.column(i).path: pf.schema.column(i).physical_type
                for i in range(len(pf.schema))}
    by_name = {fld.name.lower(): fld for fld in pf.schema_arrow}
    out = []
    for c, declared in ds.source.schema.items():
        fld = by_name.get(c.lower())
        if fld is None:
            continue
        if pa.types.is_null(fld.type):
            out.append((c, fld.name, NULL))
            continue
        typ = _spark_type(fld.type, physical.get(fld.name, ""))
        if typ == NANOS:
            how = NANOS if declared == "timestamp" else MISMATCH + T.LongType().json()
        elif isinstance(typ, T.DataType):
            how = typ.json() if _fits(declared, typ) else MISMATCH + typ.json()
        else:  # nested values and durations are never of a declared type
            nested = _nested_type(fld.type)
            if nested is None:
                return Unreadable("", f"Spark cannot read column {fld.name!r}: its Parquet type "
                                  f"is {fld.type} (declared {declared}); write the column as a "
                                  f"type Spark reads (e.g. float32 for float16, a timestamp or "
                                  f"text for a time of day) and land the file again")
            how = MISMATCH + nested.json()
        out.append((c, fld.name, how))
    return tuple(out)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _read_type(how: str) -> T.DataType:
    if how == NANOS:
        return T.LongType()
    return _parse_datatype_json_string(how.removeprefix(MISMATCH))


def _parquet_group(spark: SparkSession, ds: DatasetConfig, paths: tuple[str, ...],
                   base: str) -> DataFrame:
    """Files of one physical schema, cast per column to the declared type (as text).

    Only the declared columns are read (an explicit read schema from the footer). A safe widening
    (int32 -> long, float -> double) is a cast; text and decimals go through `try_cast` later, so
    a value that does not fit is `bad_value:<col>` for its row only; a value of another kind (a
    struct, a float for a string, a timestamp for a date) is `bad_value:<col>` too (`MISMATCH`,
    the row kept whole in `_raw`). A declared column the files lack, or of Arrow's null type, is
    null for these files' rows only.
    """
    with Storage(base or paths[0]).fs.open(paths[0], "rb") as fh:
        layout = parquet_layout(ds, pq.ParquetFile(fh))
    assert not isinstance(layout, Unreadable)  # vetted by `plan_batch`
    read = T.StructType([T.StructField(f, _read_type(how)) for _, f, how in layout
                         if how != NULL])
    df = spark.read.options(**READ_OPTIONS).schema(read).parquet(*[spark_path(p) for p in paths])
    present = {c: (f, how) for c, f, how in layout if how != NULL}
    cols = []
    wrong: list[Column] = []
    for c, decl in ds.source.schema.items():
        if c not in present:
            cols.append(F.lit(None).cast("string").alias(c))
            continue
        f, how = present[c]
        q = _quoted(f)
        if how.startswith(MISMATCH):
            cols.append(F.lit(None).cast("string").alias(c))
            wrong.append(F.when(F.col(q).isNotNull(), F.lit(c)))
        elif how == NANOS:  # read as nanoseconds (nanosAsLong): floored to microseconds
            micros = F.expr(f"{q} div 1000 - CASE WHEN {q} % 1000 < 0 THEN 1 ELSE 0 END")
            cols.append(F.timestamp_micros(micros).cast("string").alias(c))
        elif isinstance(read[f].dataType, _WIDENS.get(decl, ())):
            cols.append(F.col(q).cast(SPARK_TYPES[decl]).cast("string").alias(c))
        else:
            cols.append(F.col(q).cast("string").alias(c))
    raw = F.to_json(F.struct(*[F.col(_quoted(f.name)) for f in read.fields]))
    out = df.select(
        *cols,
        _source_file(base).alias(SOURCE_FILE),
        F.lit(0).cast("long").alias(BLOCK),
        F.col("_metadata.row_index").alias(ROW),
        raw.alias(RAW),
        F.lit(False).alias("_malformed"),
        (F.filter(F.array(*wrong), lambda x: x.isNotNull()) if wrong
         else F.lit(None).cast("array<string>")).alias(MISMATCHED),
    )
    return _with_encoding_check(out, ds)


def _read_parquet(spark: SparkSession, ds: DatasetConfig, plan: BatchPlan) -> DataFrame:
    groups = plan.parquet_groups or (tuple(plan.paths),)
    frames = [_parquet_group(spark, ds, g, plan.base) for g in groups]
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def _batch_schema(ds: DatasetConfig) -> T.StructType:
    fields = [T.StructField(c, T.StringType()) for c in ds.source.schema]
    fields += [
        T.StructField(SOURCE_FILE, T.StringType()),
        T.StructField(BLOCK, T.LongType()),
        T.StructField(ROW, T.LongType()),
        T.StructField(RAW, T.StringType()),
        T.StructField("_malformed", T.BooleanType()),
        T.StructField(PRE, T.StringType()),
        T.StructField(MISMATCHED, T.ArrayType(T.StringType())),
    ]
    return T.StructType(fields)


def empty_batch(spark: SparkSession, ds: DatasetConfig) -> DataFrame:
    """A zero-row batch with the parsed schema (an hour with no input is a zero-row load)."""
    return spark.createDataFrame([], _batch_schema(ds))


def _unreadable_rows(spark: SparkSession, ds: DatasetConfig, plan: BatchPlan) -> DataFrame:
    nulls = [None] * len(ds.source.schema)
    rows = [(*nulls, u.path, 0, i, u.error, False, UNREADABLE, None)
            for i, u in enumerate(plan.unreadable)]
    return spark.createDataFrame(rows, _batch_schema(ds))


def read_text_batch(spark: SparkSession, ds: DatasetConfig,
                    plan: BatchPlan | list[str]) -> DataFrame:
    """All columns still as text, plus origin, `_malformed` and the read-time reason."""
    if not isinstance(plan, BatchPlan):  # plain paths (benchmarks): vet them here
        sizes = [InputFile(path=p, size=1, mtime=0.0) for p in plan]
        plan = plan_batch(ds, sizes)
    if not plan.files:
        df = empty_batch(spark, ds)
    else:
        reader = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet}
        df = reader[ds.source.format](spark, ds, plan).select(*_batch_schema(ds).names)
    if plan.unreadable:
        df = df.unionByName(_unreadable_rows(spark, ds, plan))
    return df


def type_and_reject(raw: DataFrame, ds: DatasetConfig) -> DataFrame:
    """Cast text columns to declared types and decide `_reject_reason`; adds `_v` with expiry."""
    schema = ds.source.schema
    exp_col = ds.expiry.column if ds.expiry else None
    reason = (F.when(F.col(PRE).isNotNull(), F.col(PRE))
              .when(F.col("_malformed"), F.lit("malformed")))
    casted: dict[str, Column] = {}
    for c, typ in schema.items():
        text = F.col(c)
        # a Parquet value of another kind (its text is null): bad_value:<c>, in schema order
        wrong = (F.coalesce(F.array_contains(F.col(MISMATCHED), F.lit(c)), F.lit(False))
                 if ds.source.format == "parquet" else None)
        if typ == "string":
            casted[c] = text
            if wrong is not None and c != exp_col:
                reason = reason.when(wrong, F.lit(f"bad_value:{c}"))
            continue
        casted[c] = text.try_cast(SPARK_TYPES[typ])
        if typ == "date":  # `YYYY-MM-DD`, or a timestamp: its date as written (offset not applied)
            day = F.trim(text)
            whole = day.rlike(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$") | (
                day.rlike(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ]")
                & text.try_cast(T.TimestampType()).isNotNull())
            casted[c] = F.when(whole, casted[c])
        if c != exp_col:  # a bad expiry value has its own reason below
            failed = text.isNotNull() & (F.trim(text) != "") & casted[c].isNull()
            reason = reason.when(failed if wrong is None else failed | wrong,
                                 F.lit(f"bad_value:{c}"))
    null_key: Column | None = None
    for k in ds.key:
        missing = casted[k].isNull()
        null_key = missing if null_key is None else (null_key | missing)
    assert null_key is not None
    reason = reason.when(null_key, F.lit("null_key"))
    df = raw.select(*[casted[c].alias(c) for c in schema], *META_COLS, reason.alias(REASON))
    if ds.expiry is not None:
        v = expiry_value(ds)
        exp_null = F.col(ds.expiry.column).isNull()
        if ds.expiry.categories is not None:
            exp_reason = (F.when(exp_null, F.lit("bad_expiry_value"))
                          .when(v < 0, F.lit("unknown_category")))
        elif ds.expiry_type == "double":
            exp_reason = F.when(exp_null | F.isnan(v), F.lit("bad_expiry_value"))
        else:
            exp_reason = F.when(exp_null, F.lit("bad_expiry_value"))
        df = df.withColumns({V: v, REASON: F.coalesce(F.col(REASON), exp_reason)})
    return df
