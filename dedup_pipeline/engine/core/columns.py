"""Every column name the engine writes or reads back: of the outputs, the index and the digests.

One home, so a name has one meaning: the outputs' partition column `LOAD_HOUR_PARTITION`
(``load_hour``) and the index entry column `ENTRY_LOAD_HOUR` (``_load_hour``) are two names for
two columns. Values are the on-disk names (design.md L1, L2, L2b, "The index"); pure Python.
"""

from __future__ import annotations

# -- the outputs (L1, L2) ----------------------------------------------------------------------
LOAD_HOUR_PARTITION = "load_hour"  # each output is Hive-partitioned by load hour (L1)
PARTITION = f"{LOAD_HOUR_PARTITION}="  # the partition directory's prefix
SOURCE_FILE = "_source_file"  # on every output
KIND = "_duplicate_kind"  # duplicates: natural or conflict (R5)
FIRST = "_first_load_hour"  # duplicates: the load hour whose unique row it duplicates (R4)
EXPIRY_POINT = "_expiry_point"  # expired: the expiry point it fell behind (R6)
REASON = "_reject_reason"  # rejected: why (R9)
RAW = "_raw"  # rejected: the original line or row as text (R9)
OUT = "_out"  # of a classified batch: the output each row goes to (never written)
BLOCK, ROW = "_blk", "_rid"  # of a parsed batch: a row's position in its file (R3; never written)

# -- the index entries ("The index"; engine/core/index/store.py) ------------------------------------
H1, H2 = "_h1", "_h2"  # the 128-bit key digest (R2), also a classified batch's
FP = "_fp"  # the 32-bit fingerprint hash (R5)
V = "_v"  # the expiry value (R6), also a parsed batch's
ENTRY_LOAD_HOUR = "_load_hour"  # the load that wrote the entry

# -- the key digest (L2b) ------------------------------------------------------------------------
KEY_HASH = "_key_hash"  # the top 32 bits of H1
