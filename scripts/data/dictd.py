"""Reader for dictd databases (Debian's dict-* packages: NAME.index + NAME.dict.dz), without dictd.

NAME.index: one line per headword, "headword TAB offset TAB length", offset and length in dictd's base 64
(digits A-Z a-z 0-9 + /, most significant first), addressing bytes of the uncompressed NAME.dict.
NAME.dict.dz: dictzip, a gzip file (plain gzip decompression reads it whole).
An entry is plain text: the headword line, then indented lines; blank lines separate its paragraphs.
Entries whose headword starts with "00-database" or "00database" are the database's own metadata.
"""

from __future__ import annotations

import gzip
import re

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VALUE = {c: k for k, c in enumerate(_B64)}


def b64_number(text: str) -> int:
    """The value of a dictd base-64 number ("Fz" -> 5*64 + 51). Rejects an empty string or another character."""
    if not text:
        raise ValueError("dictd index: empty base-64 number")
    value = 0
    for c in text:
        if c not in _B64_VALUE:
            raise ValueError(f"dictd index: {c!r} is not a base-64 digit in {text!r}")
        value = value * 64 + _B64_VALUE[c]
    return value


def parse_index(text: str) -> list[tuple[str, int, int]]:
    """(headword, offset, length) of each index line, in index order. Rejects a line without three tab-separated
    fields or with a bad number, naming the line."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 3:
            raise ValueError(f"dictd index line {number}: {len(fields)} tab-separated fields, expected 3 "
                             f"(headword, offset, length)")
        try:
            out.append((fields[0], b64_number(fields[1]), b64_number(fields[2])))
        except ValueError as e:
            raise ValueError(f"dictd index line {number}: {e}") from None
    return out


def is_metadata(headword: str) -> bool:
    return headword.lower().startswith(("00-database", "00database"))


def read_entries(index: bytes, dict_dz: bytes) -> list[tuple[str, str]]:
    """(headword, text) of each entry of the database in data order, each stretch of the data once (headwords that
    share an entry give it once, under the first of them), metadata entries left out. Rejects an entry that
    reaches past the end of the data."""
    data = gzip.decompress(dict_dz)
    entries = {}
    for headword, offset, length in parse_index(index.decode("utf-8", errors="replace")):
        if offset + length > len(data):
            raise ValueError(f"dictd entry {headword!r}: bytes {offset}..{offset + length} past the end of the "
                             f"{len(data)}-byte data")
        if (offset, length) not in entries and not is_metadata(headword):
            entries[(offset, length)] = headword
    return [(headword, data[offset:offset + length].decode("utf-8", errors="replace"))
            for (offset, length), headword in sorted(entries.items())]


# Markup of the GCIDE and FOLDOC databases: pronunciations between backslashes (\Ab*do"men\), and source tags at
# the end of a sense ([1913 Webster], [PJC], [WordNet 1.5], [Webster 1913 Suppl.]).
_PRONUNCIATION = re.compile(r"[ \t]*\\[^\\\n]{1,80}\\")
_SOURCE_TAG = re.compile(r"\[(?:1913 Webster|Webster 1913 Suppl\.|WordNet 1\.5|PJC|[A-Z]{2,4}|Century Dict\.)\]")
_CROSS_REFERENCE = re.compile(r"\{([^{}]*)\}")


def entry_paragraphs(text: str) -> list[str]:
    """Paragraphs of one entry (raw text): blank-line-separated blocks, lines joined; pronunciations and source
    tags removed, cross-reference braces ({word} -> word) dropped."""
    text = _PRONUNCIATION.sub("", text)
    text = _SOURCE_TAG.sub("", text)
    text = _CROSS_REFERENCE.sub(r"\1", text)
    return [" ".join(line.strip() for line in block.splitlines()) for block in re.split(r"\n\s*\n", text)
            if block.strip()]


def group_entries(entries: list[tuple[str, str]], min_bytes: int) -> list[tuple[str, list[str]]]:
    """Consecutive entries gathered into documents of at least `min_bytes` bytes of entry text (the last may be
    shorter): (first headword, paragraphs). Single entries are shorter than a useful training document."""
    if min_bytes < 1:
        raise ValueError(f"min_bytes must be >= 1, got {min_bytes}")
    out: list[tuple[str, list[str]]] = []
    current: list[str] = []
    first, size = "", 0
    for headword, text in entries:
        if not current:
            first = headword
        current.extend(entry_paragraphs(text))
        size += len(text.encode("utf-8"))
        if size >= min_bytes:
            out.append((first, current))
            current, size = [], 0
    if current:
        out.append((first, current))
    return out
