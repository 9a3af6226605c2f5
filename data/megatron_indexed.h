// Reading Megatron-LM's indexed dataset (MMapIndexedDataset, megatron/core/datasets/indexed_dataset.py),
// the PREFIX.bin + PREFIX.idx pair its preprocess_data.py writes. PREFIX.idx, all little-endian: the
// 9-byte magic "MMIDIDX\0\0", uint64 version 1, uint8 token dtype code, uint64 sequence count S, uint64
// document-index length D, then int32 sequence lengths[S] (in tokens), int64 sequence pointers[S] (byte
// offsets into PREFIX.bin) and int64 document index[D], which rises from 0 to S: document d is sequences
// [index[d], index[d+1]). PREFIX.bin holds each sequence's token ids at its pointer. This file owns that
// format: opening checks the header, the array sizes, the document index and every sequence against the
// size of PREFIX.bin in one pass over the .idx; documents are then read one at a time, each token id
// checked against the vocabulary. Both files are read through bounded buffers, never loaded whole, and
// every problem is a std::runtime_error naming the file and what is wrong.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpt {

class MegatronIndexedReader {
 public:
  // Opens PREFIX.idx and PREFIX.bin and validates their structure (token ids are checked as read).
  explicit MegatronIndexedReader(const std::string& prefix);
  ~MegatronIndexedReader();
  MegatronIndexedReader(const MegatronIndexedReader&) = delete;
  MegatronIndexedReader& operator=(const MegatronIndexedReader&) = delete;

  const std::string& idx_path() const { return idx_path_; }
  const std::string& bin_path() const { return bin_path_; }
  const std::string& dtype_name() const { return dtype_name_; }  // "uint16", "int32", ...
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_documents_; }
  int64_t token_bytes() const { return token_bytes_; }  // bytes of PREFIX.bin the sequences cover
  int64_t bytes_read() const { return bytes_read_; }    // of those, read so far

  // Replaces `ids` with the next document's token ids (its sequences concatenated, nothing added);
  // false after the last document. Throws naming PREFIX.bin, the document, the sequence and the id when
  // an id is negative or not below `vocab_size`.
  bool next_document(std::vector<int32_t>& ids, int64_t vocab_size);

 private:
  class Streams;
  void validate();
  std::string idx_path_, bin_path_, dtype_name_;
  int item_bytes_ = 0;
  int64_t num_sequences_ = 0, num_documents_ = 0, token_bytes_ = 0, bytes_read_ = 0;
  int64_t next_doc_ = 0;
  std::unique_ptr<Streams> streams_;
};

}  // namespace gpt
