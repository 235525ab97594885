"""Reader for SWORD's compressed verse-keyed modules (drivers zText/zCom and zText4/zCom4), as shipped in
Debian's sword-* packages, without libsword.

A testament (ot or nt) is three files, all integers little-endian:
- block index (.bzs for texts, .czs for commentaries): one 12-byte record per block:
  u32 offset into the data file, u32 compressed size, u32 uncompressed size;
- verse index (.bzv / .czv): one record per verse slot in versification order: u32 block number, u32 offset in
  the uncompressed block, then the entry size: u16 (zText/zCom, 10-byte records) or u32 (zText4/zCom4, 12-byte
  records); size 0 means an empty slot;
- data (.bzz / .czz): the compressed blocks (CompressType ZIP = zlib, BZIP2, XZ).
The module's .conf (mods.d/NAME.conf) names the driver, compression and encoding.
"""

from __future__ import annotations

import bz2
import lzma
import struct
import zlib

VERSE_RECORD_BYTES = {"ztext": 10, "zcom": 10, "ztext4": 12, "zcom4": 12}
_DECOMPRESS = {"zip": zlib.decompress, "bzip2": bz2.decompress, "xz": lzma.decompress}


def parse_conf(text: str) -> dict[str, str]:
    """Key=value lines of a SWORD .conf file (the [Name] line becomes key "Name"); later keys win; continuation
    lines (ending in a backslash) are joined."""
    conf: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            conf["Name"] = line[1:-1]
            continue
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        while value.endswith("\\"):
            value = value[:-1] + "\n" + next(lines, "")
        conf[key.strip()] = value.strip()
    return conf


def read_entries(block_index: bytes, verse_index: bytes, data: bytes, driver: str,
                 compress: str = "ZIP", encoding: str = "UTF-8") -> list[str]:
    """The non-empty entries of one testament, in versification order, each entry once (slots linked to the same
    text are returned once). The verse record size follows `driver` unless only the other size (10 or 12 bytes)
    divides the verse index. Raises ValueError on an unknown driver or compression, index sizes that are not a
    whole number of records, or an entry that points outside its block."""
    driver = driver.lower()
    if driver not in VERSE_RECORD_BYTES:
        raise ValueError(f"unsupported SWORD driver {driver!r}; expected one of {sorted(VERSE_RECORD_BYTES)}")
    decompress = _DECOMPRESS.get(compress.lower())
    if decompress is None:
        raise ValueError(f"unsupported SWORD compression {compress!r}; expected one of ZIP, BZIP2, XZ")
    record = VERSE_RECORD_BYTES[driver]
    # Some packaged modules name one driver and were built with the other (sword-comm-mhcc: zCom4 in its .conf,
    # 10-byte verse records in its files): trust the file size when only the other record size divides it.
    other = 22 - record
    if len(verse_index) % record and not len(verse_index) % other:
        record = other
    if len(block_index) % 12 or len(verse_index) % record:
        raise ValueError(f"SWORD index sizes {len(block_index)} (blocks) and {len(verse_index)} (verses) are not "
                         f"multiples of 12 and {record} bytes")
    blocks = [struct.unpack_from("<III", block_index, i) for i in range(0, len(block_index), 12)]
    cache: dict[int, bytes] = {}
    seen = set()
    entries = []
    size_format = "<H" if record == 10 else "<I"
    for i in range(0, len(verse_index), record):
        block, offset = struct.unpack_from("<II", verse_index, i)
        (size,) = struct.unpack_from(size_format, verse_index, i + 8)
        if size == 0 or (block, offset, size) in seen:
            continue
        seen.add((block, offset, size))
        if block >= len(blocks):
            raise ValueError(f"SWORD verse record {i // record} points to block {block} of {len(blocks)}")
        if block not in cache:
            start, length, expanded = blocks[block]
            cache[block] = decompress(data[start:start + length])
            if len(cache[block]) != expanded:
                raise ValueError(f"SWORD block {block} expands to {len(cache[block])} bytes, index says {expanded}")
        raw = cache[block]
        if offset + size > len(raw):
            raise ValueError(f"SWORD verse record {i // record} ({offset}+{size}) runs past block {block} "
                             f"({len(raw)} bytes)")
        entries.append(raw[offset:offset + size].decode(encoding, errors="replace"))
    return entries
