"""sentencepiece BPE tokenizer: training on a deterministic sample of the train split, and encoding corpus files
into token ids, through Debian's `spm_train` / `spm_encode` commands (package sentencepiece).

Special ids: <unk> 0, <s> 1, </s> 2 (the end-of-text token written after every document), no padding id.
Byte fallback is on, so any text encodes without <unk>.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import zlib
from array import array
from concurrent.futures import ThreadPoolExecutor

UNK_ID, BOS_ID, EOT_ID = 0, 1, 2


class TokenizerError(RuntimeError):
    pass


def _tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise TokenizerError(f"`{name}` not found on PATH; install Debian's `sentencepiece` package "
                             f"(scripts/setup.sh does)")
    return path


def keep_for_sample(line: str, fraction: float) -> bool:
    """Deterministic sampling of training lines: keep a line iff CRC-32(line) / 2^32 < fraction."""
    return zlib.crc32(line.encode("utf-8")) < fraction * 4294967296.0


def write_training_sample(corpus_txt: str, sample_path: str, sample_bytes: int) -> tuple[int, int]:
    """Writes the non-empty lines of corpus_txt that keep_for_sample selects, about sample_bytes in all (every line
    when the corpus is smaller). Returns (lines, bytes) written."""
    total = os.path.getsize(corpus_txt)
    fraction = 1.0 if total <= sample_bytes else sample_bytes / total
    lines = written = 0
    with open(corpus_txt, encoding="utf-8", newline="\n") as src, \
            open(sample_path, "w", encoding="utf-8", newline="\n") as dst:
        for line in src:
            line = line.rstrip("\n")
            if line and keep_for_sample(line, fraction):
                dst.write(line + "\n")
                lines += 1
                written += len(line.encode("utf-8")) + 1
    return lines, written


# spm_train records its thread count in the model file; a fixed count keeps the model's bytes (and the
# tokenizer_crc32 of every shard) the same on every machine. BPE training is mostly single-threaded anyway.
TRAIN_THREADS = 2


def train(sample_path: str, model_prefix: str, vocab_size: int, max_sentence_length: int = 4192, log=print) -> str:
    """Trains a BPE model on sample_path (one sentence per line; lines longer than max_sentence_length bytes are
    skipped by sentencepiece, so callers cut them first). Writes model_prefix.model / .vocab; returns the .model
    path. Deterministic: no input sampling inside sentencepiece, fixed seed; spm_train runs in the model's folder
    with relative names because the model records its input and prefix in its trainer spec."""
    folder = os.path.dirname(os.path.abspath(model_prefix))
    cmd = [_tool("spm_train"), f"--input={os.path.relpath(sample_path, folder)}",
           f"--model_prefix={os.path.basename(model_prefix)}",
           "--model_type=bpe", f"--vocab_size={vocab_size}", "--byte_fallback=true", "--character_coverage=0.9995",
           "--split_digits=true", f"--max_sentence_length={max_sentence_length}", "--input_sentence_size=0",
           "--shuffle_input_sentence=false", f"--num_threads={TRAIN_THREADS}", "--random_seed=20240521",
           f"--unk_id={UNK_ID}", f"--bos_id={BOS_ID}", f"--eos_id={EOT_ID}", "--pad_id=-1",
           "--hard_vocab_limit=true", "--minloglevel=1"]
    log(f"data: spm_train vocab={vocab_size} on {os.path.getsize(sample_path) / 1e6:.1f} MB")
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=folder)
    if result.returncode != 0 or not os.path.exists(model_prefix + ".model"):
        raise TokenizerError(f"spm_train failed (exit {result.returncode}): {result.stderr.strip()[-1500:]}")
    return model_prefix + ".model"


def _encode_lines(model: str, lines: list[str]) -> list[array]:
    """Token ids of each line (spm_encode reads and writes one line per line, in order)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.txt"), os.path.join(tmp, "out.txt")
        with open(src, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(line + "\n" for line in lines)
        result = subprocess.run([_tool("spm_encode"), f"--model={model}", "--output_format=id",
                                 f"--input={src}", f"--output={dst}", "--minloglevel=1"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise TokenizerError(f"spm_encode failed (exit {result.returncode}): {result.stderr.strip()[-1500:]}")
        out = []
        with open(dst, encoding="utf-8") as f:
            for line in f:
                out.append(array("H", map(int, line.split())))
    if len(out) != len(lines):
        raise TokenizerError(f"spm_encode returned {len(out)} lines for {len(lines)}")
    return out


def encode_documents(model: str, documents: list[list[str]], threads: int = 2) -> list[array]:
    """Token ids of each document (list of lines): its lines' ids concatenated, then EOT_ID. Lines are encoded by
    `threads` spm_encode processes on contiguous slices; the result does not depend on `threads`."""
    flat = [line for doc in documents for line in doc]
    if any(not line for line in flat):
        raise TokenizerError("documents must not contain empty lines")
    slices = max(1, min(threads, len(flat)))
    bounds = [len(flat) * k // slices for k in range(slices + 1)]
    with ThreadPoolExecutor(slices) as pool:
        parts = list(pool.map(lambda k: _encode_lines(model, flat[bounds[k]:bounds[k + 1]]), range(slices)))
    encoded = iter(ids for part in parts for ids in part)
    out = []
    for doc in documents:
        tokens = array("H")
        for _ in doc:
            ids = next(encoded)
            if not ids:
                raise TokenizerError("spm_encode produced no token for a non-empty line")
            tokens.extend(ids)
        tokens.append(EOT_ID)
        out.append(tokens)
    return out


def vocab_size_of(model: str) -> int:
    """Vocabulary size of a trained model: the number of lines of its .vocab file beside it."""
    vocab = model[:-6] + ".vocab" if model.endswith(".model") else model + ".vocab"
    with open(vocab, encoding="utf-8") as f:
        return sum(1 for _ in f)
