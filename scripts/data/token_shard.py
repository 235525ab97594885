"""Token shard format, version 1 (the reader used by training is trainer/data/token_shard.h; the two must agree).

A shard is a 64-byte header followed by token_count tokens, each a little-endian uint16. Documents are
concatenated, each followed by the end-of-text token, so document_count = number of end-of-text tokens.
File size = 64 + 2 * token_count exactly.

Header, all integers little-endian:
  offset size field
       0    8 magic            b"FP4MTOK\\0"
       8    4 format_version   1
      12    4 header_bytes     64
      16    4 vocab_size       tokenizer vocabulary size; every token < vocab_size <= 65536
      20    4 eot_token        end-of-text token id (sentencepiece's </s>)
      24    8 token_count
      32    8 document_count   number of eot_token in the payload
      40    4 token_bytes      2 (uint16 tokens)
      44    4 payload_crc32    CRC-32 (ISO-HDLC, as zlib.crc32) of the token bytes
      48    4 tokenizer_crc32  CRC-32 of the sentencepiece .model file the shard was made with (0: unknown), as
                               tokenizer_crc32() computes it
      52    4 header_crc32     CRC-32 of header bytes 0..51
      56    8 reserved         zero
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array

MAGIC = b"FP4MTOK\0"
FORMAT_VERSION = 1
HEADER_BYTES = 64
TOKEN_BYTES = 2
_HEAD = struct.Struct("<8sIIIIQQIII")  # bytes 0..51, the part covered by header_crc32
assert _HEAD.size == 52


class ShardError(ValueError):
    pass


def tokenizer_crc32(model_path: str) -> int:
    """CRC-32 (zlib.crc32) of the whole tokenizer model file, read in 1 MiB chunks: the header's tokenizer_crc32.
    trainer/data/token_shard.h's tokenizer_model_crc32 computes the same value."""
    crc = 0
    with open(model_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            crc = zlib.crc32(chunk, crc)
    return crc


def _le_bytes(tokens: array) -> bytes:
    if sys.byteorder == "little":
        return tokens.tobytes()
    swapped = array("H", tokens)
    swapped.byteswap()
    return swapped.tobytes()


def pack_header(vocab_size: int, eot_token: int, token_count: int, document_count: int, payload_crc32: int,
                tokenizer_crc32: int = 0, version: int = FORMAT_VERSION, magic: bytes = MAGIC) -> bytes:
    """The 64 header bytes (version and magic can be overridden to make bad shards in tests)."""
    head = _HEAD.pack(magic, version, HEADER_BYTES, vocab_size, eot_token, token_count, document_count,
                      TOKEN_BYTES, payload_crc32, tokenizer_crc32)
    return head + struct.pack("<I", zlib.crc32(head)) + bytes(8)


def unpack_header(data: bytes) -> dict:
    """The header fields of the first 64 bytes of a shard, without validation."""
    if len(data) < HEADER_BYTES:
        raise ShardError(f"a shard header is {HEADER_BYTES} bytes, got {len(data)}")
    names = ("magic", "format_version", "header_bytes", "vocab_size", "eot_token", "token_count", "document_count",
             "token_bytes", "payload_crc32", "tokenizer_crc32")
    header = dict(zip(names, _HEAD.unpack_from(data, 0)))
    (header["header_crc32"],) = struct.unpack_from("<I", data, 52)
    return header


def write_shard(path: str, tokens: array, vocab_size: int, eot_token: int, tokenizer_crc32: int = 0) -> dict:
    """Writes `tokens` (array('H')) as a shard at `path` (through a temporary name and a rename) and returns its
    header. Rejects a vocabulary outside [1, 65536], an eot_token or a token not below vocab_size."""
    if not 1 <= vocab_size <= 65536:
        raise ShardError(f"vocab_size must be in [1, 65536] for uint16 tokens, got {vocab_size}")
    if not 0 <= eot_token < vocab_size:
        raise ShardError(f"eot_token {eot_token} is not below vocab_size {vocab_size}")
    if tokens and max(tokens) >= vocab_size:
        raise ShardError(f"token {max(tokens)} is not below vocab_size {vocab_size}")
    payload = _le_bytes(tokens)
    header = pack_header(vocab_size, eot_token, len(tokens), tokens.count(eot_token), zlib.crc32(payload),
                         tokenizer_crc32)
    with open(path + ".tmp", "wb") as f:
        f.write(header)
        f.write(payload)
    os.replace(path + ".tmp", path)
    return unpack_header(header)


def read_shard(path: str, expected_vocab_size: int | None = None) -> tuple[dict, array]:
    """(header, tokens) of a shard, after the same checks as the C++ reader: magic, version, header size, header
    CRC, token width, file size, vocabulary (and expected_vocab_size when given), payload CRC, token range,
    document count. Raises ShardError naming the file and what was wrong."""
    if not os.path.isfile(path):
        raise ShardError(f"token shard '{path}': no such file")
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER_BYTES:
        raise ShardError(f"token shard '{path}': {len(data)} bytes, shorter than the {HEADER_BYTES}-byte header "
                         f"(truncated)")
    h = unpack_header(data)
    if h["magic"] != MAGIC:
        raise ShardError(f"token shard '{path}': magic {h['magic']!r}, expected {MAGIC!r} (not a token shard)")
    if h["format_version"] != FORMAT_VERSION:
        raise ShardError(f"token shard '{path}': format version {h['format_version']}, this reader reads "
                         f"version {FORMAT_VERSION}")
    if h["header_bytes"] != HEADER_BYTES:
        raise ShardError(f"token shard '{path}': header_bytes {h['header_bytes']}, expected {HEADER_BYTES}")
    if zlib.crc32(data[:52]) != h["header_crc32"]:
        raise ShardError(f"token shard '{path}': header CRC-32 mismatch (corrupted header)")
    if h["token_bytes"] != TOKEN_BYTES:
        raise ShardError(f"token shard '{path}': token_bytes {h['token_bytes']}, expected {TOKEN_BYTES}")
    expected_size = HEADER_BYTES + TOKEN_BYTES * h["token_count"]
    if len(data) != expected_size:
        fault = "truncated" if len(data) < expected_size else "trailing bytes"
        raise ShardError(f"token shard '{path}': {len(data)} bytes, expected {expected_size} for "
                         f"{h['token_count']} tokens ({fault})")
    if not 1 <= h["vocab_size"] <= 65536 or h["eot_token"] >= h["vocab_size"]:
        raise ShardError(f"token shard '{path}': vocab_size {h['vocab_size']} / eot_token {h['eot_token']} invalid")
    if expected_vocab_size is not None and h["vocab_size"] != expected_vocab_size:
        raise ShardError(f"token shard '{path}': vocabulary of {h['vocab_size']} tokens, the model expects "
                         f"{expected_vocab_size}")
    payload = data[HEADER_BYTES:]
    if zlib.crc32(payload) != h["payload_crc32"]:
        raise ShardError(f"token shard '{path}': payload CRC-32 {zlib.crc32(payload):#010x} does not match the "
                         f"header's {h['payload_crc32']:#010x} (corrupted tokens)")
    tokens = array("H")
    tokens.frombytes(payload)
    if sys.byteorder != "little":
        tokens.byteswap()
    if tokens and max(tokens) >= h["vocab_size"]:
        raise ShardError(f"token shard '{path}': token {max(tokens)} is not below vocab_size {h['vocab_size']}")
    if tokens.count(h["eot_token"]) != h["document_count"]:
        raise ShardError(f"token shard '{path}': {tokens.count(h['eot_token'])} end-of-text tokens, header says "
                         f"{h['document_count']} documents")
    return h, tokens
