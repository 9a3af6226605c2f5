#!/usr/bin/python3
"""End-to-end test of `gpt-train prep --from-megatron PREFIX`, on Megatron indexed datasets written by
megatron_indexed_writer.py (an independent writer of the published format):

- uint8, int16, uint16, int32 and int64 ids, documents of several sequences (some empty), some ending
  with the end-of-document id and some not, sequences stored in order, back to front and at unaligned
  offsets: the shards hold exactly the documents, in order, with the end-of-document id appended where
  it was missing, empty documents skipped, and the tokenizer attributes that `prep --input` writes;
- a converted dataset trains (`data.train: [P]`);
- bad input (missing files, bad magic, truncated header / arrays / .bin, unknown version or dtype,
  float ids, a pointer past the end, a broken document index, negative lengths, ids outside the
  vocabulary or negative, trailing bytes) and --from-megatron with --input each stop with a message
  naming the file and the problem, and leave no index;
- truncations of an .idx (every cut in the header, every 5th byte after) and random byte damage to the
  .idx and the .bin give exit status 0 or 1, never a crash or a hang.

    megatron_import_test.py GPT_TRAIN SOURCE_DIR
"""
import json
import os
import random
import re
import struct
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_indexed_writer import write_indexed_dataset  # noqa: E402

HEADER = 34  # magic 9, version 8, dtype 1, sequence count 8, document-index length 8


def main():
    binary, source = sys.argv[1], sys.argv[2]
    tiny = os.path.join(source, "tests", "data", "gpt2_tiny")
    tokenizers = {
        "gpt2": (["--tokenizer", "gpt2", "--vocab-file", os.path.join(tiny, "vocab.json"),
                  "--merges-file", os.path.join(tiny, "merges.txt")], 454, 453),
        "bytes": (["--tokenizer", "bytes"], 257, 256),
    }
    failures = []

    def check(ok, what, detail=""):
        print(("ok   " if ok else "FAIL ") + what + ("" if ok or not detail else "\n     " + detail))
        if not ok:
            failures.append(what)

    def prep(*args, timeout=60):
        try:
            run = subprocess.run([binary, "prep", *args], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return 124, "timed out"
        return run.returncode, run.stdout + run.stderr

    def read_shard_set(prefix):
        """(index, documents as lists of ids, attributes of every shard, dtypes of every shard)"""
        with open(prefix + ".index.json") as f:
            index = json.load(f)
        docs, attrs, dtypes = [], [], []
        for entry in index["shards"]:
            with h5py.File(os.path.join(os.path.dirname(prefix), entry["file"]), "r") as f:
                tokens, offsets = f["tokens"][:], f["doc_offsets"][:]
                attrs.append({k: (v.decode() if isinstance(v, bytes) else int(v)) for k, v in f.attrs.items()})
                dtypes.append(str(tokens.dtype))
                docs += [tokens[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
        return index, docs, attrs, dtypes

    with tempfile.TemporaryDirectory() as tmp:
        # What `prep --input` writes for each tokenizer: the reference for the shard attributes.
        with open(os.path.join(tmp, "text.txt"), "w") as f:
            f.write("hello world\n")
        reference = {}
        for name, (flags, _, _) in tokenizers.items():
            rc, out = prep("--input", os.path.join(tmp, "text.txt"), *flags, "--output-prefix",
                           os.path.join(tmp, "ref", name))
            check(rc == 0, f"prep --input with {name}", out)
            with open(os.path.join(tmp, "ref", name + ".index.json")) as f:
                reference[name] = json.load(f)

        # ---- conversion ----
        cases = [("uint16", "gpt2", "in_order", 0), ("int32", "gpt2", "reversed", 3), ("int64", "gpt2", "in_order", 5),
                 ("int16", "bytes", "reversed", 0), ("uint8", "bytes", "in_order", 1)]
        for n, (dtype, tok, storage, gap) in enumerate(cases):
            flags, vocab, eod = tokenizers[tok]
            rng = random.Random(n)
            max_id = min(vocab, np.iinfo(dtype).max + 1)
            documents = []
            for d in range(60):
                seqs = [[rng.randrange(max_id) for _ in range(rng.randrange(0, 12))]
                        for _ in range(rng.randrange(1, 5))]
                if d % 3 == 0 and eod < max_id:
                    seqs[-1].append(eod)  # ends with the end-of-document id already
                documents.append(seqs)
            documents[7] = []             # a document without sequences
            documents[8] = [[], []]       # one whose sequences are all empty
            documents[9] = [[eod]] if eod < max_id else [[1]]  # just an end-of-document id (or one id)
            prefix = os.path.join(tmp, f"mg_{dtype}")
            write_indexed_dataset(prefix, documents, dtype, storage=storage, gap_bytes=gap)
            want = []
            appended = empty = 0
            for seqs in documents:
                ids = [i for s in seqs for i in s]
                if not ids:
                    empty += 1
                    continue
                if ids[-1] != eod:
                    ids.append(eod)
                    appended += 1
                want.append(ids)
            out_prefix = os.path.join(tmp, "out", f"{dtype}")
            rc, out = prep("--from-megatron", prefix, *flags, "--output-prefix", out_prefix, "--shard-tokens", "100")
            what = f"{dtype} ({tok}, {storage}, gap {gap})"
            check(rc == 0, f"{what}: converts", out)
            if rc != 0:
                continue
            index, docs, attrs, dtypes = read_shard_set(out_prefix)
            first_diff = next((i for i, (a, b) in enumerate(zip(docs, want)) if a != b), min(len(docs), len(want)))
            check(docs == want, f"{what}: every document, in order, ids exact, end-of-document appended where missing",
                  f"first difference at document {first_diff}")
            check(len(index["shards"]) > 2, f"{what}: --shard-tokens 100 gives several shards ({len(index['shards'])})")
            check(index["num_docs"] == len(want) and index["num_tokens"] == sum(map(len, want)),
                  f"{what}: index counts", f"{index['num_docs']} docs, {index['num_tokens']} tokens")
            ref = reference[tok]
            same = all(index[k] == ref[k] for k in ("tokenizer", "tokenizer_hash", "vocab_size", "eod_id"))
            same = same and all(a["tokenizer"] == ref["tokenizer"] and a["tokenizer_hash"] == ref["tokenizer_hash"]
                                and a["vocab_size"] == vocab and a["eod_id"] == eod for a in attrs)
            check(same, f"{what}: tokenizer name, hash, vocab size and eod id as prep --input writes them")
            check(set(dtypes) == {"uint16"}, f"{what}: shards store uint16 ids", str(dtypes))
            check(f"appended the end-of-document id to {appended} of {len(want)} documents" in out,
                  f"{what}: summary counts the appended end-of-document ids ({appended})", out)
            check(f"skipped {empty} empty documents" in out, f"{what}: summary counts the empty documents ({empty})",
                  out)
            check(re.search(r"wrote \d+ shard\(s\), \d+ documents, \d+ tokens .* MB/s of \.bin", out) is not None,
                  f"{what}: summary line", out)

        # ---- a converted dataset trains ----
        rng = np.random.default_rng(7)
        documents = [[rng.integers(0, 256, size=int(rng.integers(20, 200))).tolist() for _ in range(3)]
                     for _ in range(200)]
        write_indexed_dataset(os.path.join(tmp, "train"), documents, "uint16")
        rc, out = prep("--from-megatron", os.path.join(tmp, "train"), "--output-prefix", os.path.join(tmp, "train_out"))
        check(rc == 0, "bytes dataset for training converts", out)
        run = subprocess.run([binary, "train", "--config", os.path.join(source, "configs", "tiny-cpu.yaml"),
                              "--set", f"data.train=[{os.path.join(tmp, 'train_out')}]",
                              "--set", "data.tokenizer=bytes",
                              "--set", "model.vocab_size=257", "--set", "training.train_iters=3",
                              "--set", "eval.interval=0", "--set", f"logging.metrics_file={tmp}/metrics.jsonl",
                              "--set", f"checkpoint.dir={tmp}/ckpt", "--set", "checkpoint.save_interval=0"],
                             capture_output=True, text=True, timeout=300)
        check(run.returncode == 0 and "iteration" in run.stdout + run.stderr,
              "gpt-train trains on the converted shards (data.train: [P])", (run.stdout + run.stderr)[-2000:])

        # ---- bad input ----
        good_docs = [[[1, 2, 3], [4, 5]], [[6]], [[7, 8, 453], [9]]]

        def make(name, dtype="uint16", documents=None):
            prefix = os.path.join(tmp, "bad", name)
            os.makedirs(os.path.dirname(prefix), exist_ok=True)
            write_indexed_dataset(prefix, documents or good_docs, dtype)
            return prefix

        def patch(path, offset, data):
            with open(path, "r+b") as f:
                f.seek(offset)
                f.write(data)

        def truncate(path, size):
            with open(path, "r+b") as f:
                f.truncate(size)

        def expect_error(name, prefix, patterns, flags=None):
            out_prefix = os.path.join(tmp, "bad_out", name)
            rc, out = prep("--from-megatron", prefix,
                           *(flags or tokenizers["gpt2"][0]), "--output-prefix", out_prefix)
            ok = rc == 1 and all(re.search(p, out) for p in patterns)
            check(ok, f"{name}: exit 1 naming {' / '.join(patterns)}", f"rc={rc}: {out.strip()}")
            check(not os.path.exists(out_prefix + ".index.json"), f"{name}: no index written")

        s_count = sum(map(len, good_docs))  # 5 sequences in 3 documents
        p = make("missing_idx")
        os.remove(p + ".idx")
        expect_error("missing .idx", p, [re.escape(p + ".idx"), "not found"])
        p = make("missing_bin")
        os.remove(p + ".bin")
        expect_error("missing .bin", p, [re.escape(p + ".bin"), "not found"])
        p = make("magic")
        patch(p + ".idx", 0, b"MMIDIDY")
        expect_error("bad magic", p, [re.escape(p + ".idx"), "magic"])
        p = make("header")
        truncate(p + ".idx", 20)
        expect_error("header truncated", p, [re.escape(p + ".idx"), "header truncated"])
        p = make("arrays")
        truncate(p + ".idx", os.path.getsize(p + ".idx") - 5)
        expect_error("index arrays truncated", p, [re.escape(p + ".idx"), "index arrays truncated"])
        p = make("version")
        patch(p + ".idx", 9, struct.pack("<Q", 2))
        expect_error("unsupported version", p, [re.escape(p + ".idx"), "unsupported version 2"])
        p = make("dtype_code")
        patch(p + ".idx", 17, bytes([9]))
        expect_error("unknown dtype code", p, [re.escape(p + ".idx"), "unknown token dtype code 9"])
        for dtype in ("float32", "float64"):
            p = make(dtype, dtype)
            expect_error(f"{dtype} ids", p, [re.escape(p + ".idx"), f"dtype is {dtype}"])
        p = make("short_bin")
        truncate(p + ".bin", os.path.getsize(p + ".bin") - 1)
        expect_error("truncated .bin", p, [re.escape(p + ".bin"), "past the end", "sequence 4 \\(document 2\\)"])
        p = make("pointer")
        patch(p + ".idx", HEADER + 4 * s_count + 8 * 2, struct.pack("<q", 1 << 40))
        expect_error("pointer past the end", p, [re.escape(p + ".idx"), re.escape(p + ".bin"), "past the end",
                                                 "sequence 2 \\(document 1\\)"])
        p = make("negative_pointer")
        patch(p + ".idx", HEADER + 4 * s_count + 8 * 1, struct.pack("<q", -8))
        expect_error("negative pointer", p, [re.escape(p + ".idx"), "negative pointer"])
        p = make("negative_length")
        patch(p + ".idx", HEADER + 4 * 1, struct.pack("<i", -2))
        expect_error("negative length", p, [re.escape(p + ".idx"), "negative length"])
        doc_index_at = HEADER + 12 * s_count
        p = make("doc_end")
        patch(p + ".idx", doc_index_at + 8 * 3, struct.pack("<q", s_count - 1))
        expect_error("document index not ending at S", p, [re.escape(p + ".idx"), f"ends at {s_count - 1}",
                                                           f"sequence count {s_count}"])
        p = make("doc_start")
        patch(p + ".idx", doc_index_at, struct.pack("<q", 1))
        expect_error("document index not starting at 0", p, [re.escape(p + ".idx"), "starts at 1"])
        p = make("doc_order")
        patch(p + ".idx", doc_index_at + 8 * 1, struct.pack("<q", 4))  # 0, 4, 3, 5
        expect_error("document index decreasing", p, [re.escape(p + ".idx"), "decreases: entry 1 is 4, entry 2 is 3"])
        p = make("doc_past")
        patch(p + ".idx", doc_index_at + 8 * 1, struct.pack("<q", 9))  # 0, 9, 3, 5
        expect_error("document index past the sequence count", p, [re.escape(p + ".idx"), "entry 1 is 9, past"])
        p = make("trailing")
        with open(p + ".idx", "ab") as f:
            f.write(bytes(s_count))
        expect_error("trailing sequence modes", p, [re.escape(p + ".idx"), "multimodal"])
        p = make("id_range", documents=[[[1, 2]], [[3], [4, 5, 454, 6]]])
        expect_error("id >= vocab size", p, [re.escape(p + ".bin"), "document 1, sequence 2, token 2",
                                             "id 454 is not below the vocabulary size 454"])
        p = make("negative_id", "int32", documents=[[[1, 2]], [[3, -7]]])
        expect_error("negative id", p, [re.escape(p + ".bin"), "document 1, sequence 1, token 1", "id -7 is negative"])
        p = make("no_docs", documents=[[[]], []])
        expect_error("only empty documents", p, [re.escape(p + ".idx"), "no documents"])
        p = make("spm")
        expect_error("spm without a model", p, ["--vocab-file"], ["--tokenizer", "spm"])
        rc, out = prep("--from-megatron", make("exclusive"), "--input", os.path.join(tmp, "text.txt"),
                       "--output-prefix", os.path.join(tmp, "x"))
        check(rc == 2 and "exclude each other" in out, "--from-megatron with --input: a usage error", out)

        # ---- damaged files never crash ----
        p = make("fuzz", "int32", documents=[[[i, i + 1] for i in range(k % 3)] for k in range(6)])
        with open(p + ".idx", "rb") as f:
            idx = f.read()
        bad = []
        # Every cut inside the fixed header, then every 5th byte of the arrays (each run starts a process).
        sizes = list(range(min(len(idx), 34))) + list(range(34, len(idx), 5))
        for size in sizes:
            with open(p + ".idx", "wb") as f:
                f.write(idx[:size])
            rc, out = prep("--from-megatron", p, "--output-prefix", os.path.join(tmp, "fuzz_out"), timeout=20)
            if rc != 1 or p + ".idx" not in out:
                bad.append(f"cut at {size}: rc={rc}: {out.strip()[-200:]}")
        check(not bad, f"truncations of the .idx ({len(sizes)} of {len(idx)} sizes) are errors naming it",
              "\n     ".join(bad[:5]))
        rng = random.Random(11)
        bad, errors = [], 0
        for trial in range(60):
            damaged = bytearray(idx)
            for _ in range(rng.randrange(1, 4)):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            with open(p + ".idx", "wb") as f:
                f.write(damaged)
            rc, out = prep("--from-megatron", p, "--output-prefix", os.path.join(tmp, "fuzz_out"), timeout=20)
            errors += rc == 1
            if rc not in (0, 1):
                bad.append(f"trial {trial}: rc={rc}: {out.strip()[-200:]}")
        check(not bad, f"60 randomly damaged .idx files: exit 0 or 1 ({errors} errors), no crash or hang",
              "\n     ".join(bad[:5]))
        with open(p + ".idx", "wb") as f:
            f.write(idx)
        with open(p + ".bin", "rb") as f:
            data = f.read()
        bad, errors = [], 0
        for trial in range(30):
            damaged = bytearray(data)
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            with open(p + ".bin", "wb") as f:
                f.write(damaged)
            rc, out = prep("--from-megatron", p, "--output-prefix", os.path.join(tmp, "fuzz_out"), timeout=20)
            errors += rc == 1
            if rc not in (0, 1) or (rc == 1 and "not below" not in out and "negative" not in out):
                bad.append(f"trial {trial}: rc={rc}: {out.strip()[-200:]}")
        check(not bad and 0 < errors < 30, f"30 .bin files with a damaged byte: converted, or an id error "
              f"({errors} errors)", "\n     ".join(bad[:5]))

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
