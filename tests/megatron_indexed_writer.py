#!/usr/bin/python3
"""Writes Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx, the format of Megatron's
MMapIndexedDataset) for the tests of `gpt-train prep --from-megatron`, from the published description of
the format alone:

    PREFIX.idx, little-endian:
        b"MMIDIDX\\x00\\x00"           9-byte magic
        uint64 version                 1
        uint8  dtype code              1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
        uint64 sequence count S
        uint64 document-index length D
        int32  sequence_lengths[S]     ids per sequence
        int64  sequence_pointers[S]    byte offset of each sequence in PREFIX.bin
        int64  document_indices[D]     0 = d_0 <= d_1 <= ... <= d_{D-1} = S; document i is sequences
                                       d_i .. d_{i+1}-1
    PREFIX.bin: the ids of each sequence, in the dtype, at its pointer.

As a library: write_indexed_dataset(prefix, documents, dtype, ...) where a document is a list of
sequences and a sequence a list of ids. As a command, it writes a random dataset for throughput runs:

    megatron_indexed_writer.py PREFIX --tokens N [--dtype uint16] [--vocab V] [--eod E] [--seed S]
"""
import argparse
import struct

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7,
               "uint16": 8}


def write_indexed_dataset(prefix, documents, dtype, storage="in_order", gap_bytes=0):
    """Writes PREFIX.bin and PREFIX.idx holding `documents` with ids stored as `dtype` (a name in
    DTYPE_CODES). `storage` places the sequences in PREFIX.bin: "in_order" (as Megatron writes them) or
    "reversed" (last sequence first: pointers then fall, which the format allows). `gap_bytes` of
    filler go before every sequence. Returns (sequence_lengths, sequence_pointers, document_indices)."""
    item = np.dtype(dtype).newbyteorder("<")
    sequences = [np.asarray(seq, dtype=np.int64) for doc in documents for seq in doc]
    document_indices = [0]
    for doc in documents:
        document_indices.append(document_indices[-1] + len(doc))
    lengths = [len(seq) for seq in sequences]
    order = list(range(len(sequences)))
    if storage == "reversed":
        order.reverse()
    elif storage != "in_order":
        raise ValueError(f"unknown storage {storage!r}")
    pointers = [0] * len(sequences)
    with open(prefix + ".bin", "wb") as out:
        offset = 0
        for k in order:
            out.write(b"\xa5" * gap_bytes)
            offset += gap_bytes
            data = sequences[k].astype(item).tobytes()
            pointers[k] = offset
            out.write(data)
            offset += len(data)
    with open(prefix + ".idx", "wb") as out:
        out.write(MAGIC)
        out.write(struct.pack("<Q", 1))
        out.write(struct.pack("<B", DTYPE_CODES[dtype]))
        out.write(struct.pack("<Q", len(sequences)))
        out.write(struct.pack("<Q", len(document_indices)))
        out.write(np.asarray(lengths, dtype="<i4").tobytes())
        out.write(np.asarray(pointers, dtype="<i8").tobytes())
        out.write(np.asarray(document_indices, dtype="<i8").tobytes())
    return lengths, pointers, document_indices


def write_random_dataset(prefix, tokens, dtype="uint16", eod=50256, seed=0):
    """A dataset of about `tokens` ids below `eod` in documents of 1 to 8 sequences of 1 to 1000 ids each,
    every document ending with `eod` (as Megatron's preprocess_data.py --append-eod writes them). Written in
    slices, so memory stays small whatever the size."""
    rng = np.random.default_rng(seed)
    item = np.dtype(dtype).newbyteorder("<")
    lengths, pointers, document_indices = [], [], [0]
    offset = 0
    with open(prefix + ".bin", "wb") as out:
        while offset // item.itemsize < tokens:
            n_seq = int(rng.integers(1, 9))
            seq_lengths = rng.integers(1, 1001, size=n_seq)
            ids = rng.integers(0, eod, size=int(seq_lengths.sum()), dtype=np.int64)
            ids[-1] = eod
            out.write(ids.astype(item).tobytes())
            for n in seq_lengths:
                lengths.append(int(n))
                pointers.append(offset)
                offset += int(n) * item.itemsize
            document_indices.append(len(lengths))
    with open(prefix + ".idx", "wb") as out:
        out.write(MAGIC + struct.pack("<QBQQ", 1, DTYPE_CODES[dtype], len(lengths), len(document_indices)))
        out.write(np.asarray(lengths, dtype="<i4").tobytes())
        out.write(np.asarray(pointers, dtype="<i8").tobytes())
        out.write(np.asarray(document_indices, dtype="<i8").tobytes())
    return len(document_indices) - 1, offset // item.itemsize


def main():
    ap = argparse.ArgumentParser(description="Write a random Megatron indexed dataset PREFIX.bin + PREFIX.idx")
    ap.add_argument("prefix")
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--dtype", default="uint16", choices=["uint16", "int32", "int64"])
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--eod", type=int, default=None, help="default: vocab - 1")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    docs, n = write_random_dataset(a.prefix, a.tokens, a.dtype, a.vocab - 1 if a.eod is None else a.eod, a.seed)
    print(f"{a.prefix}.bin: {docs} documents, {n} tokens")


if __name__ == "__main__":
    main()
