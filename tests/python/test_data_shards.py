"""Token shards and the tokenizer stages of the data tool (scripts/data): the shard header round trip and byte
layout, rejection of each kind of bad shard, and a tiny sentencepiece vocabulary trained on a sample corpus made
here, through the tokenizer and shard stages of build_data (determinism, end-of-text per document, idempotency)."""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import zlib
from unittest import mock
from array import array
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data_test_util  # noqa: E402  (puts scripts/data on the import path)

import build_data  # noqa: E402
import corpus  # noqa: E402
import token_shard  # noqa: E402
import tokenizer  # noqa: E402

HAVE_SPM = all(shutil.which(t) for t in ("spm_train", "spm_encode", "spm_decode"))
SPM_REASON = "sentencepiece's spm_train/spm_encode/spm_decode are not installed (scripts/setup.sh installs them)"


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="fp4moe_data_")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def path(self, name):
        return os.path.join(self.tmp, name)


class ShardFormatTest(TempDirTest):
    def tokens(self, n=3001, vocab=1000, eot=2):
        rng = __import__("random").Random(n)
        t = array("H", (rng.randrange(3, vocab) for _ in range(n)))
        for k in range(50, n, 97):
            t[k] = eot
        return t

    def test_round_trip_and_documented_byte_layout(self):
        tokens = self.tokens()
        written = token_shard.write_shard(self.path("train_000.bin"), tokens, 1000, 2, tokenizer_crc32=0xDEADBEEF)
        data = Path(self.path("train_000.bin")).read_bytes()
        self.assertEqual(len(data), 64 + 2 * len(tokens))
        self.assertEqual(data[0:8], b"FP4MTOK\0")
        self.assertEqual(struct.unpack_from("<IIII", data, 8), (1, 64, 1000, 2))
        self.assertEqual(struct.unpack_from("<QQ", data, 24), (len(tokens), tokens.count(2)))
        self.assertEqual(struct.unpack_from("<IIII", data, 40),
                         (2, zlib.crc32(data[64:]), 0xDEADBEEF, zlib.crc32(data[:52])))
        self.assertEqual(data[56:64], bytes(8))
        self.assertEqual(list(struct.unpack_from(f"<{len(tokens)}H", data, 64)), list(tokens))
        header, back = token_shard.read_shard(self.path("train_000.bin"), expected_vocab_size=1000)
        self.assertEqual(header, written)
        self.assertEqual(back, tokens)

    def test_tokenizer_checksum_is_the_crc32_of_the_whole_model_file(self):
        # The same check value as the C++ TokenizerChecksum test: both sides compute one function.
        Path(self.path("check.model")).write_bytes(b"123456789")
        self.assertEqual(token_shard.tokenizer_crc32(self.path("check.model")), 0xCBF43926)
        big = bytes(range(256)) * (3 * 4096 + 1)  # more than one 1 MiB read
        Path(self.path("big.model")).write_bytes(big)
        self.assertEqual(token_shard.tokenizer_crc32(self.path("big.model")), zlib.crc32(big))

    def test_writer_rejects_tokens_outside_the_vocabulary(self):
        with self.assertRaisesRegex(token_shard.ShardError, "not below vocab_size"):
            token_shard.write_shard(self.path("a.bin"), array("H", [1, 2, 500]), 500, 2)
        with self.assertRaisesRegex(token_shard.ShardError, "65536"):
            token_shard.write_shard(self.path("a.bin"), array("H", [1]), 70000, 2)
        self.assertFalse(os.path.exists(self.path("a.bin")))

    def bad(self, edit, expected_vocab_size=1000):
        path = self.path("val_007.bin")
        token_shard.write_shard(path, self.tokens(), 1000, 2)
        data = bytearray(Path(path).read_bytes())
        data = edit(data)
        Path(path).write_bytes(bytes(data))
        with self.assertRaises(token_shard.ShardError) as ctx:
            token_shard.read_shard(path, expected_vocab_size)
        self.assertIn("val_007.bin", str(ctx.exception))
        return str(ctx.exception)

    @staticmethod
    def reseal(data):
        struct.pack_into("<I", data, 52, zlib.crc32(bytes(data[:52])))
        return data

    def test_rejects_each_kind_of_bad_shard(self):
        self.assertIn("shorter than the 64-byte header", self.bad(lambda d: d[:30]))
        self.assertIn("truncated", self.bad(lambda d: d[:-2]))
        self.assertIn("trailing bytes", self.bad(lambda d: d + b"\0\0"))
        self.assertIn("not a token shard", self.bad(lambda d: self.reseal(bytearray(b"NOTTOKEN") + d[8:])))
        self.assertIn("format version 9",
                      self.bad(lambda d: self.reseal(d[:8] + struct.pack("<I", 9) + d[12:])))
        self.assertIn("corrupted header", self.bad(lambda d: d[:24] + struct.pack("<Q", 5) + d[32:]))

        def flip_token(d):
            d[64 + 2 * 100] ^= 1
            return d
        self.assertIn("corrupted tokens", self.bad(flip_token))
        self.assertIn("the model expects 32768", self.bad(lambda d: d, expected_vocab_size=32768))
        self.assertIn("not below vocab_size 400",
                      self.bad(lambda d: self.reseal(d[:16] + struct.pack("<I", 400) + d[20:]), 400))
        self.assertIn("documents",
                      self.bad(lambda d: self.reseal(d[:32] + struct.pack("<Q", 1) + d[40:])))
        with self.assertRaisesRegex(token_shard.ShardError, "no such file"):
            token_shard.read_shard(self.path("missing.bin"))


@unittest.skipUnless(HAVE_SPM, SPM_REASON)
class TokenizerAndShardStagesTest(TempDirTest):
    VOCAB = 400  # 3 specials + 256 byte pieces + characters + merges

    def make_corpus(self, folder):
        os.makedirs(folder, exist_ok=True)
        for split, seed, count in (("train", 11, 300), ("val", 12, 20)):
            docs = [corpus.CorpusDocument(f"src{k % 3}", f"{k}", corpus.document_text(p, 2048))
                    for k, p in enumerate(data_test_util.sample_documents(seed, count))]
            corpus.write_split(docs, os.path.join(folder, f"{split}.txt"))
        manifest = {"sources": [{"source": f"src{k}", "train_bytes": 0, "val_bytes": 0, "train_documents": 0,
                                 "val_documents": 0, "package": "p", "version": "1", "licence": "l"}
                                for k in range(3)]}
        Path(folder, "manifest.json").write_text(json.dumps(manifest))

    def args(self, **kw):
        a = dict(jobs=2, vocab_size=self.VOCAB, sample_mb=64, shard_tokens=4000, force=False)
        a.update(kw)
        return argparse.Namespace(**a)

    def run_stages(self, cache, **kw):
        """Runs the tokenizer and shard stages; returns their log lines."""
        lines = []
        with mock.patch.object(build_data, "log", lines.append):
            self._run_stages(cache, **kw)
        return lines

    def _run_stages(self, cache, **kw):
        build_data.stage_tokenizer(self.args(**kw), Path(cache, "corpus"), Path(cache, "tokenizer"))
        build_data.stage_shards(self.args(**kw), Path(cache, "corpus"), Path(cache, "tokenizer"),
                                Path(cache, "shards"))

    def test_stages_make_valid_deterministic_shards_and_skip_when_up_to_date(self):
        cache = self.path("cache")
        self.make_corpus(os.path.join(cache, "corpus"))
        self.run_stages(cache)
        shards = Path(cache, "shards")
        stats = json.loads((shards / "stats.json").read_text())
        self.assertEqual(stats["vocab_size"], self.VOCAB)
        self.assertGreater(len([s for s in stats["shards"] if s["split"] == "train"]), 1)  # 4000-token shards

        # Every shard validates; documents = end-of-text tokens = documents of the split; shards end on a document.
        model_crc = zlib.crc32(Path(cache, "tokenizer", "spm.model").read_bytes())
        for split in ("train", "val"):
            docs = corpus.read_split(os.path.join(cache, "corpus", f"{split}.txt"))
            files = sorted(shards.glob(f"{split}_*.bin"))
            total_docs = total_tokens = 0
            for f in files:
                header, tokens = token_shard.read_shard(str(f), self.VOCAB)
                self.assertEqual(header["tokenizer_crc32"], model_crc)
                self.assertEqual(tokens[-1], tokenizer.EOT_ID)
                self.assertEqual(tokens.count(tokenizer.UNK_ID), 0)  # byte fallback: no <unk>
                total_docs += header["document_count"]
                total_tokens += len(tokens)
            self.assertEqual(total_docs, len(docs))
            self.assertEqual(total_tokens, sum(s[f"{split}_tokens"] for s in stats["sources"].values()))

        # Decoding the first document gives its text back (paragraph lines joined by spaces).
        _, tokens = token_shard.read_shard(str(shards / "val_000.bin"))
        first = list(tokens[:list(tokens).index(tokenizer.EOT_ID)])
        decoded = subprocess.run(["spm_decode", f"--model={cache}/tokenizer/spm.model", "--input_format=id"],
                                 input=" ".join(map(str, first)) + "\n", capture_output=True, text=True,
                                 check=True).stdout.strip()
        self.assertEqual(decoded, " ".join(corpus.read_split(os.path.join(cache, "corpus", "val.txt"))[0][1]))

        # A second run changes nothing; a rebuild elsewhere gives the same bytes (deterministic).
        before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in shards.glob("*.bin")}
        model_before = Path(cache, "tokenizer", "spm.model").read_bytes()
        self.run_stages(cache)
        self.assertEqual({p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in shards.glob("*.bin")}, before)
        other = self.path("other")
        self.make_corpus(os.path.join(other, "corpus"))
        self.run_stages(other)
        self.assertEqual(Path(other, "tokenizer", "spm.model").read_bytes(), model_before)
        self.assertEqual({p.name: p.read_bytes() for p in Path(other, "shards").glob("*.bin")},
                         {k: v[1] for k, v in before.items()})

    def built_cache(self):
        """A cache with a corpus, a tokenizer and shards (several train shards), and the shards' bytes."""
        cache = self.path("cache")
        self.make_corpus(os.path.join(cache, "corpus"))
        self.run_stages(cache)
        return cache, {p.name: p.read_bytes() for p in Path(cache, "shards").glob("*.bin")}

    def assert_rebuilt(self, lines, name, fault):
        """The log names the shard, its fault and that it is rebuilt."""
        said = [line for line in lines if name in line and fault in line]
        self.assertTrue(said and "rebuilding" in said[0], "\n".join(lines))

    def test_a_truncated_or_corrupted_shard_is_detected_and_rebuilt_alone(self):
        cache, good = self.built_cache()
        shards = Path(cache, "shards")
        self.assertIn("train_001.bin", good)
        others = {p.name: p.stat().st_mtime_ns for p in shards.glob("*.bin") if p.name != "train_001.bin"}
        with open(shards / "train_001.bin", "r+b") as f:
            f.truncate(len(good["train_001.bin"]) - 2)
        self.assert_rebuilt(self.run_stages(cache), "train_001.bin", "truncated")
        self.assertEqual({p.name: p.read_bytes() for p in shards.glob("*.bin")}, good)
        self.assertEqual({p.name: p.stat().st_mtime_ns for p in shards.glob("*.bin") if p.name != "train_001.bin"},
                         others, "only the damaged shard is rewritten")

        data = bytearray(good["val_000.bin"])
        data[64 + 2 * 10] ^= 0x01  # one token bit: same size, payload CRC now wrong
        (shards / "val_000.bin").write_bytes(bytes(data))
        self.assert_rebuilt(self.run_stages(cache), "val_000.bin", "corrupted")
        self.assertEqual({p.name: p.read_bytes() for p in shards.glob("*.bin")}, good)

        (shards / "train_000.bin").unlink()
        self.assert_rebuilt(self.run_stages(cache), "train_000.bin", "missing")
        self.assertEqual({p.name: p.read_bytes() for p in shards.glob("*.bin")}, good)
        self.assertIn("data: shards up to date", self.run_stages(cache))

    def test_a_shard_not_made_by_the_build_is_removed(self):
        cache, good = self.built_cache()
        shards = Path(cache, "shards")
        extra = "train_%03d.bin" % len([n for n in good if n.startswith("train_")])
        (shards / extra).write_bytes(good["train_000.bin"])  # the trainer would read it as one more shard
        self.assert_rebuilt(self.run_stages(cache), extra, "not made by this build")
        self.assertEqual({p.name: p.read_bytes() for p in shards.glob("*.bin")}, good)

    def test_a_stale_shard_of_another_tokenizer_is_rebuilt(self):
        cache, good = self.built_cache()
        shards = Path(cache, "shards")
        model_crc = zlib.crc32(Path(cache, "tokenizer", "spm.model").read_bytes())
        # The same tokens, stamped with another tokenizer's checksum; the stamp's record made to agree, so that
        # only the header's tokenizer_crc32 tells.
        header, tokens = token_shard.read_shard(str(shards / "train_000.bin"))
        token_shard.write_shard(str(shards / "train_000.bin"), tokens, header["vocab_size"], header["eot_token"],
                                model_crc ^ 0x5A5A5A5A)
        stamp = json.loads((shards / ".stamp.json").read_text())
        if "outputs" in stamp:
            stamp["outputs"]["train_000.bin"] = build_data.file_record(shards / "train_000.bin")
            (shards / ".stamp.json").write_text(json.dumps(stamp))
        lines = self.run_stages(cache)
        self.assert_rebuilt(lines, "train_000.bin", f"{model_crc ^ 0x5A5A5A5A:#010x}")
        self.assertTrue(any(f"{model_crc:#010x}" in line for line in lines), "\n".join(lines))
        self.assertEqual({p.name: p.read_bytes() for p in shards.glob("*.bin")}, good)

    def test_a_corrupted_tokenizer_model_is_retrained(self):
        cache, good = self.built_cache()
        model = Path(cache, "tokenizer", "spm.model")
        model_bytes = model.read_bytes()
        data = bytearray(model_bytes)
        data[len(data) // 2] ^= 0xFF
        model.write_bytes(bytes(data))
        self.assert_rebuilt(self.run_stages(cache), "spm.model", "corrupted")
        self.assertEqual(model.read_bytes(), model_bytes)
        self.assertEqual({p.name: p.read_bytes() for p in Path(cache, "shards").glob("*.bin")}, good)

    def test_encoding_does_not_depend_on_the_number_of_processes(self):
        corpus_dir = self.path("corpus")
        self.make_corpus(corpus_dir)
        sample = self.path("sample.txt")
        tokenizer.write_training_sample(os.path.join(corpus_dir, "train.txt"), sample, 10 ** 9)
        model = tokenizer.train(sample, self.path("spm"), self.VOCAB, log=lambda m: None)
        docs = [lines for _, lines in corpus.read_split(os.path.join(corpus_dir, "val.txt"))]
        one, three = tokenizer.encode_documents(model, docs, 1), tokenizer.encode_documents(model, docs, 3)
        self.assertEqual(one, three)
        self.assertEqual([t.count(tokenizer.EOT_ID) for t in one], [1] * len(docs))

    def test_training_sample_is_deterministic_and_bounded(self):
        corpus_dir = self.path("corpus")
        self.make_corpus(corpus_dir)
        train = os.path.join(corpus_dir, "train.txt")
        size = os.path.getsize(train)
        a, b = self.path("a.txt"), self.path("b.txt")
        la, ba = tokenizer.write_training_sample(train, a, size // 4)
        tokenizer.write_training_sample(train, b, size // 4)
        self.assertEqual(Path(a).read_bytes(), Path(b).read_bytes())
        self.assertTrue(size // 8 < ba < size // 2, (ba, size))
        with open(a, encoding="utf-8") as f:
            self.assertTrue(all(line.strip() for line in f))


class TokenizerProgressTest(TempDirTest):
    def test_spm_train_is_not_silent(self):
        """While spm_train runs (here a stand-in that takes 0.5 s), heartbeat lines say how long it has run."""
        corpus_dir, folder = Path(self.path("corpus")), Path(self.path("tokenizer"))
        corpus_dir.mkdir()
        (corpus_dir / "train.txt").write_text("A line of text.\n", encoding="utf-8")

        def slow_train(sample, prefix, vocab_size, max_sentence_length, log):
            time.sleep(0.5)
            Path(prefix + ".model").write_bytes(b"model")
            Path(prefix + ".vocab").write_text("".join(f"p{k}\t0\n" for k in range(vocab_size)))

        lines = []
        args = argparse.Namespace(vocab_size=5, sample_mb=1, force=False)
        with mock.patch.object(build_data, "log", lines.append), mock.patch.object(tokenizer, "train", slow_train), \
                mock.patch.object(build_data, "HEARTBEAT_SECONDS", 0.1, create=True):
            build_data.stage_tokenizer(args, corpus_dir, folder)
        beats = [line for line in lines if "spm_train" in line and line.endswith("s elapsed")]
        self.assertGreaterEqual(len(beats), 2, "\n".join(lines))
        self.assertEqual(lines[-1][:len("data: tokenizer trained")], "data: tokenizer trained")


class BuildDataArgumentsTest(TempDirTest):
    def test_out_of_range_arguments_stop_before_any_stage(self):
        cases = [(["--jobs", "0"], "--jobs 0: must be >= 1"),
                 (["--vocab-size", "70000"], "--vocab-size 70000: must be in [1, 65536]"),
                 (["--vocab-size", "0"], "--vocab-size 0: must be in [1, 65536]"),
                 (["--val-per-10000", "10001"], "--val-per-10000 10001: must be in [0, 10000]"),
                 (["--val-per-10000", "-1"], "--val-per-10000 -1: must be in [0, 10000]"),
                 (["--min-doc-bytes", "-5"], "--min-doc-bytes -5: must be >= 0"),
                 (["--max-line-bytes", "0"], "--max-line-bytes 0: must be >= 1"),
                 (["--sample-mb", "0"], "--sample-mb 0: must be >= 1"),
                 (["--shard-tokens", "0"], "--shard-tokens 0: must be >= 1")]
        cache = self.path("cache")
        script = os.path.join(os.path.dirname(build_data.__file__), "build_data.py")
        for args, expected in cases:
            with self.subTest(args=args):
                r = subprocess.run([sys.executable, script, "--cache", cache, *args], capture_output=True, text=True,
                                   timeout=60)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(expected, r.stderr)
                self.assertNotIn("Traceback", r.stderr)
                self.assertFalse(os.path.exists(cache), "no stage may run")

    def test_a_cache_that_cannot_be_a_folder_is_refused(self):
        blocker = self.path("plain_file")
        with open(blocker, "w", encoding="utf-8") as f:
            f.write("x")
        script = os.path.join(os.path.dirname(build_data.__file__), "build_data.py")
        for cache, expected in ((blocker, f"--cache {blocker}: not a folder"),
                                (os.path.join(blocker, "cache"), "cannot create the folder")):
            with self.subTest(cache=cache):
                r = subprocess.run([sys.executable, script, "--cache", cache], capture_output=True, text=True,
                                   timeout=60)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(expected, r.stderr)
                self.assertNotIn("Traceback", r.stderr)


if __name__ == "__main__":
    unittest.main()
