"""From source documents to the corpus files: clean, drop exact duplicates, split train/validation by hash.

Corpus text files (train.txt, val.txt): UTF-8, one paragraph per line (no line longer than `max_line_bytes`),
documents separated by one empty line. Beside each, NAME.docs.tsv: one row per document in file order:
sha256 (hex, of the document text), source, bytes (UTF-8 of the text), lines.

Document text = its clean paragraphs (extract_text.clean_paragraphs), each cut by extract_text.split_long_line,
joined with "\\n". Deduplication, in source order (the first occurrence is kept):
- paragraphs: a line whose normalized form (paragraph_key: casefolded, every run of non-alphanumeric characters one
  space) has at least DEDUP_MIN_CHARS characters and occurred before, anywhere in the corpus, is dropped (the
  same notice, boilerplate sentence or dictionary gloss in several packages, versions or pages);
- documents: an exact duplicate of an earlier document (same sha256, before or after the paragraph rule) is
  dropped, and so is a document left shorter than `min_doc_bytes` by the paragraph rule.
The split depends on the (deduplicated) document text alone: validation iff int(sha256[:8 bytes], big-endian) %
10000 < val_per_10000. Within a split, documents are ordered by sha256, which mixes the sources deterministically.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field

import extract_text


@dataclass
class CorpusDocument:
    source: str
    doc_id: str
    text: str
    sha256: str = ""

    def __post_init__(self):
        if not self.sha256:
            self.sha256 = hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@dataclass
class SourceCounts:
    documents: int = 0          # after cleaning and the length filter, before deduplication
    bytes: int = 0
    duplicate_paragraphs: int = 0        # lines dropped as repeats of an earlier paragraph (paragraph_key)
    duplicate_paragraph_bytes: int = 0
    short_after_dedup: int = 0  # documents dropped because fewer than min_doc_bytes were left after that
    duplicates: int = 0         # documents dropped as exact duplicates of an earlier one
    train_documents: int = 0
    val_documents: int = 0
    train_bytes: int = 0
    val_bytes: int = 0


def document_text(paragraphs, max_line_bytes: int, min_prose_fraction: float = 0.85) -> str:
    """The text of one document: clean paragraphs, long ones cut into lines of at most max_line_bytes bytes."""
    lines = []
    for p in extract_text.clean_paragraphs(paragraphs, min_prose_fraction):
        lines.extend(extract_text.split_long_line(p, max_line_bytes))
    return "\n".join(lines)


def is_validation(sha256_hex: str, val_per_10000: int) -> bool:
    """The split rule: a document is in validation iff its first 8 hash bytes, big-endian, mod 10000 are below
    val_per_10000 (100 = 1%). Depends on the document text only, never on order or on other documents."""
    if not 0 <= val_per_10000 <= 10000:
        raise ValueError(f"val_per_10000 must be in [0, 10000], got {val_per_10000}")
    return int(sha256_hex[:16], 16) % 10000 < val_per_10000


# Paragraphs shorter than this (normalized) are never deduplicated: headings such as "Description" or "Examples"
# recur legitimately in every document.
DEDUP_MIN_CHARS = 40
_NOT_ALNUM = re.compile(r"[\W_]+")


def paragraph_key(line: str) -> int | None:
    """The deduplication key of one corpus line: the first 8 bytes (big-endian) of the BLAKE2b hash of its
    normalized form (casefolded, each run of characters other than letters and digits one space, trimmed), or None
    when that form is shorter than DEDUP_MIN_CHARS (such lines are never dropped)."""
    normalized = _NOT_ALNUM.sub(" ", line.casefold()).strip()
    if len(normalized) < DEDUP_MIN_CHARS:
        return None
    return int.from_bytes(hashlib.blake2b(normalized.encode("utf-8"), digest_size=8).digest(), "big")


def drop_seen_paragraphs(text: str, seen: set) -> tuple[str, int, int]:
    """`text` without its lines whose paragraph_key is in `seen` (or repeats one of its own earlier lines); adds
    the keys of the kept lines to `seen`. Returns (text, lines dropped, bytes dropped)."""
    kept, dropped, dropped_bytes = [], 0, 0
    for line in text.split("\n"):
        key = paragraph_key(line)
        if key is not None:
            if key in seen:
                dropped += 1
                dropped_bytes += len(line.encode("utf-8")) + 1
                continue
            seen.add(key)
        kept.append(line)
    return "\n".join(kept), dropped, dropped_bytes


@dataclass
class Corpus:
    train: list[CorpusDocument] = field(default_factory=list)
    val: list[CorpusDocument] = field(default_factory=list)
    counts: dict[str, SourceCounts] = field(default_factory=dict)


def build_corpus(documents_by_source, val_per_10000: int = 100, min_doc_bytes: int = 200) -> Corpus:
    """documents_by_source: iterable of (source name, [CorpusDocument]) in source order, texts already made by
    document_text. Returns the deduplicated, split, hash-ordered corpus and per-source counts."""
    corpus = Corpus()
    seen: set[str] = set()
    seen_paragraphs: set[int] = set()
    for source, docs in documents_by_source:
        counts = corpus.counts.setdefault(source, SourceCounts())
        for doc in docs:
            size = len(doc.text.encode("utf-8"))
            if size < min_doc_bytes:
                continue
            counts.documents += 1
            counts.bytes += size
            if doc.sha256 in seen:
                counts.duplicates += 1
                continue
            seen.add(doc.sha256)
            text, dropped, dropped_bytes = drop_seen_paragraphs(doc.text, seen_paragraphs)
            if dropped:
                counts.duplicate_paragraphs += dropped
                counts.duplicate_paragraph_bytes += dropped_bytes
                size = len(text.encode("utf-8"))
                if size < min_doc_bytes:
                    counts.short_after_dedup += 1
                    continue
                doc = CorpusDocument(doc.source, doc.doc_id, text)
                if doc.sha256 in seen:
                    counts.duplicates += 1
                    continue
                seen.add(doc.sha256)
            if is_validation(doc.sha256, val_per_10000):
                corpus.val.append(doc)
                counts.val_documents += 1
                counts.val_bytes += size
            else:
                corpus.train.append(doc)
                counts.train_documents += 1
                counts.train_bytes += size
    corpus.train.sort(key=lambda d: d.sha256)
    corpus.val.sort(key=lambda d: d.sha256)
    return corpus


def write_split(docs: list[CorpusDocument], text_path: str) -> None:
    """Writes text_path (paragraph lines, documents separated by an empty line) and text_path's .docs.tsv index,
    each through a temporary name and a rename."""
    index_path = docs_index_path(text_path)
    with open(text_path + ".tmp", "w", encoding="utf-8", newline="\n") as text, \
            open(index_path + ".tmp", "w", encoding="utf-8", newline="\n") as index:
        index.write("sha256\tsource\tbytes\tlines\n")
        for k, doc in enumerate(docs):
            if k:
                text.write("\n")
            text.write(doc.text + "\n")
            index.write(f"{doc.sha256}\t{doc.source}\t{len(doc.text.encode('utf-8'))}\t{doc.text.count(chr(10)) + 1}\n")
    os.replace(text_path + ".tmp", text_path)
    os.replace(index_path + ".tmp", index_path)


def docs_index_path(text_path: str) -> str:
    base = text_path[:-4] if text_path.endswith(".txt") else text_path
    return base + ".docs.tsv"


def read_split(text_path: str) -> list[tuple[str, list[str]]]:
    """(source, lines) per document of a corpus text file, checked against its .docs.tsv index."""
    with open(docs_index_path(text_path), encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    docs: list[tuple[str, list[str]]] = []
    current: list[str] = []
    with open(text_path, encoding="utf-8", newline="\n") as f:
        for line in f:
            line = line.rstrip("\n")
            if line:
                current.append(line)
            elif current:
                docs.append(current)
                current = []
    if current:
        docs.append(current)
    if len(docs) != len(rows):
        raise ValueError(f"{text_path}: {len(docs)} documents but its index lists {len(rows)}")
    out = []
    for (sha, source, _, n_lines), lines in zip(rows, docs):
        if int(n_lines) != len(lines):
            raise ValueError(f"{text_path}: document {sha[:12]} has {len(lines)} lines, index says {n_lines}")
        out.append((source, lines))
    return out
