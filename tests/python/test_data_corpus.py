"""Corpus assembly of the data tool (scripts/data/corpus.py): document text, exact-duplicate removal, the
train/validation split by document hash, and the corpus files, on a seeded sample corpus made here."""

import os
import random
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data_test_util  # noqa: E402  (puts scripts/data on the import path)

import corpus  # noqa: E402


def sample_corpus_documents(seed, count, source):
    return [corpus.CorpusDocument(source, f"{source}#{k}", corpus.document_text(paragraphs, 2048))
            for k, paragraphs in enumerate(data_test_util.sample_documents(seed, count))]


class DocumentTextTest(unittest.TestCase):
    def test_cleans_filters_and_cuts_long_paragraphs(self):
        rng = random.Random(5)
        long_paragraph = data_test_util.sample_paragraph(rng, 200)
        text = corpus.document_text(["  A  first\tparagraph. ", "x = f(a[1]);", long_paragraph], 300)
        lines = text.split("\n")
        self.assertEqual(lines[0], "A first paragraph.")
        self.assertNotIn("x = f", text)
        self.assertTrue(all(0 < len(line.encode()) <= 300 for line in lines))
        self.assertEqual(" ".join(lines[1:]).split(), long_paragraph.split())


class BuildCorpusTest(unittest.TestCase):
    def test_exact_duplicates_are_dropped_first_occurrence_kept(self):
        a = sample_corpus_documents(1, 50, "alpha")
        b = sample_corpus_documents(2, 30, "beta")
        # beta repeats five of alpha's documents and one of its own.
        b += [corpus.CorpusDocument("beta", "copy", d.text) for d in a[:5]] + [corpus.CorpusDocument("beta", "self",
                                                                                                      b[0].text)]
        built = corpus.build_corpus([("alpha", a), ("beta", b)], val_per_10000=100, min_doc_bytes=1)
        docs = built.train + built.val
        self.assertEqual(len(docs), 80)
        self.assertEqual(len({d.sha256 for d in docs}), 80)
        self.assertEqual(built.counts["alpha"].duplicates, 0)
        self.assertEqual(built.counts["beta"].duplicates, 6)
        self.assertEqual(built.counts["beta"].documents, 36)
        self.assertEqual(sum(d.source == "beta" for d in docs), 30)
        for name, c in built.counts.items():
            self.assertEqual(c.train_documents + c.val_documents + c.duplicates, c.documents, name)

    def test_short_documents_are_dropped(self):
        docs = [corpus.CorpusDocument("s", "short", "Too short."),
                corpus.CorpusDocument("s", "long", "Long enough. " * 20)]
        built = corpus.build_corpus([("s", docs)], min_doc_bytes=200)
        self.assertEqual([d.doc_id for d in built.train + built.val], ["long"])
        self.assertEqual(built.counts["s"].documents, 1)

    def test_split_depends_on_the_document_alone(self):
        docs = sample_corpus_documents(3, 3000, "s")
        first = corpus.build_corpus([("s", docs)], val_per_10000=100, min_doc_bytes=1)
        val_ids = {d.sha256 for d in first.val}
        # Another order and other neighbours: every document keeps its split.
        shuffled = list(docs[1000:])
        random.Random(9).shuffle(shuffled)
        second = corpus.build_corpus([("t", sample_corpus_documents(4, 500, "t")), ("s", shuffled)],
                                     val_per_10000=100, min_doc_bytes=1)
        for d in second.train + second.val:
            if d.source == "s":
                self.assertEqual(d.sha256 in val_ids, d in second.val, d.doc_id)
                self.assertEqual(d in second.val, corpus.is_validation(d.sha256, 100))
        # About 1% of 3000 documents (binomial: 30 +- 5.5; 5 standard deviations either side).
        self.assertTrue(3 <= len(first.val) <= 58, len(first.val))

    def test_split_extremes_and_bounds(self):
        docs = sample_corpus_documents(5, 200, "s")
        self.assertEqual(len(corpus.build_corpus([("s", docs)], 0, 1).val), 0)
        self.assertEqual(len(corpus.build_corpus([("s", docs)], 10000, 1).train), 0)
        with self.assertRaises(ValueError):
            corpus.is_validation("00" * 32, 10001)

    def test_splits_are_ordered_by_hash(self):
        built = corpus.build_corpus([("s", sample_corpus_documents(6, 300, "s"))], 500, 1)
        for split in (built.train, built.val):
            self.assertEqual([d.sha256 for d in split], sorted(d.sha256 for d in split))


class CorpusFilesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="fp4moe_data_")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_write_and_read_round_trip(self):
        docs = sample_corpus_documents(7, 40, "alpha") + sample_corpus_documents(8, 20, "beta")
        path = os.path.join(self.tmp, "train.txt")
        corpus.write_split(docs, path)
        back = corpus.read_split(path)
        self.assertEqual(back, [(d.source, d.text.split("\n")) for d in docs])
        with open(path, encoding="utf-8") as f:
            content = f.read()
        self.assertEqual(content.count("\n\n"), len(docs) - 1)  # one empty line between documents
        self.assertFalse(os.path.exists(path + ".tmp"))

    def test_read_rejects_a_text_file_that_disagrees_with_its_index(self):
        docs = sample_corpus_documents(9, 10, "alpha")
        path = os.path.join(self.tmp, "val.txt")
        corpus.write_split(docs, path)
        with open(path, "a", encoding="utf-8") as f:
            f.write("\nAn extra document.\n")
        with self.assertRaisesRegex(ValueError, "11 documents but its index lists 10"):
            corpus.read_split(path)


if __name__ == "__main__":
    unittest.main()
