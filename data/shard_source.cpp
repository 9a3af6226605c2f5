// The shard-backed SampleSource of one split (SplitSource), the weighted blend of several (BlendSource),
// and make_shard_source, which parses the data spec and checks tokenizer and vocabulary before any
// training starts. Per-epoch document orders are built on first use and cached (two epochs), so a
// sample costs a binary search plus one hyperslab read per document it touches.
#include "data/shard_source.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "data/sample_order.h"
#include "data/shard_set.h"

namespace gpt {

namespace {

bool parse_number(const std::string& s, double& v) {
  char* end = nullptr;
  v = std::strtod(s.c_str(), &end);
  return !s.empty() && *end == '\0';
}

class SplitSource final : public SampleSource {
 public:
  SplitSource(std::shared_ptr<const ShardCorpus> corpus, int64_t doc_begin, int64_t doc_end, int64_t seq, uint64_t seed,
              std::string label)
      : corpus_(std::move(corpus)), doc_begin_(doc_begin), doc_end_(doc_end), seq_(seq), seed_(seed),
        label_(std::move(label)) {
    for (int64_t d = doc_begin_; d < doc_end_; ++d) tokens_ += corpus_->doc_length(d);
    samples_ = tokens_ > 0 ? (tokens_ - 1) / seq_ : 0;
    if (samples_ <= 0)
      throw std::runtime_error(label_ + " is empty: it has " + std::to_string(doc_end_ - doc_begin_) +
                               " documents / " + std::to_string(tokens_) + " tokens, fewer than seq_length + 1 = " +
                               std::to_string(seq_ + 1) + " (use more data or change data.split)");
  }

  int64_t size() const override { return samples_; }

  void sample(int64_t index, int32_t* out) const override {
    if (index < 0) throw std::out_of_range("negative sample index for " + label_);
    auto order = epoch_order(index / samples_);
    uint64_t start = order->samples(uint64_t(index % samples_)) * uint64_t(seq_);
    size_t k = size_t(std::upper_bound(order->cum.begin(), order->cum.end(), start) - order->cum.begin()) - 1;
    int64_t offset = int64_t(start - order->cum[k]), need = seq_ + 1;
    while (need > 0) {
      int64_t doc = doc_begin_ + int64_t(order->docs(k));
      int64_t take = std::min(corpus_->doc_length(doc) - offset, need);
      if (take > 0) corpus_->read_doc(doc, offset, take, out);
      out += std::max<int64_t>(take, 0);
      need -= std::max<int64_t>(take, 0);
      offset = 0;
      ++k;
    }
  }

  std::string describe() const override {
    return label_ + " (" + std::to_string(doc_end_ - doc_begin_) + " documents, " + std::to_string(tokens_) +
           " tokens, " + std::to_string(samples_) + " samples of " + std::to_string(seq_) + "+1 tokens per epoch)";
  }

 private:
  struct EpochOrder {
    int64_t epoch;
    IndexPermutation docs, samples;
    std::vector<uint64_t> cum;  // token offset of the k-th document of this epoch's order
  };

  std::shared_ptr<const EpochOrder> epoch_order(int64_t epoch) const {
    std::lock_guard<std::mutex> lock(m_);
    for (const auto& e : cache_)
      if (e && e->epoch == epoch) return e;
    const uint64_t n = uint64_t(doc_end_ - doc_begin_);
    auto e = std::make_shared<EpochOrder>(EpochOrder{
        epoch, IndexPermutation(n, mix_key({seed_, uint64_t(epoch), 0xD0C5ull, uint64_t(doc_begin_), n})),
        IndexPermutation(uint64_t(samples_), mix_key({seed_, uint64_t(epoch), 0x5A3Bull, uint64_t(doc_begin_), n})),
        {}});
    e->cum.resize(n + 1);
    e->cum[0] = 0;
    for (uint64_t k = 0; k < n; ++k)
      e->cum[k + 1] = e->cum[k] + uint64_t(corpus_->doc_length(doc_begin_ + int64_t(e->docs(k))));
    cache_[next_slot_] = e;
    next_slot_ = (next_slot_ + 1) % cache_.size();
    return e;
  }

  std::shared_ptr<const ShardCorpus> corpus_;
  int64_t doc_begin_, doc_end_, seq_;
  uint64_t seed_;
  std::string label_;
  int64_t tokens_ = 0, samples_ = 0;
  mutable std::mutex m_;
  mutable std::array<std::shared_ptr<const EpochOrder>, 2> cache_;
  mutable size_t next_slot_ = 0;
};

class BlendSource final : public SampleSource {
 public:
  BlendSource(std::vector<std::unique_ptr<SampleSource>> parts, std::vector<double> weights)
      : parts_(std::move(parts)), schedule_(std::move(weights)) {
    for (const auto& p : parts_) size_ += p->size();
  }
  // One pass over the blend visits as many samples as its parts hold together.
  int64_t size() const override { return size_; }
  void sample(int64_t index, int32_t* tokens) const override {
    auto [d, j] = schedule_.locate(index);
    parts_[d]->sample(j, tokens);
  }
  std::string describe() const override {
    std::ostringstream o;
    o << "blend of";
    for (size_t d = 0; d < parts_.size(); ++d)
      o << (d ? ", " : " ") << schedule_.weights()[d] << " x " << parts_[d]->describe();
    return o.str();
  }

 private:
  std::vector<std::unique_ptr<SampleSource>> parts_;
  BlendSchedule schedule_;
  int64_t size_ = 0;
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t k = 0; k < v.size(); ++k) s += (k ? " " : "") + v[k];
  return s;
}

void check_tokenizer(const ShardCorpus& c, const std::string& expected, int64_t model_vocab) {
  const ShardMeta& m = c.meta();
  if (!expected.empty()) {
    size_t at = expected.find('@');
    std::string name = expected.substr(0, at), hash = at == std::string::npos ? "" : expected.substr(at + 1);
    if (m.tokenizer != name || (!hash.empty() && m.tokenizer_hash != hash))
      throw std::runtime_error("data '" + c.name() + "' was tokenized with '" + m.tokenizer + "@" + m.tokenizer_hash +
                               "' but data.tokenizer expects '" + expected + "'");
  }
  if (model_vocab > 0 && m.vocab_size > model_vocab)
    throw std::runtime_error("data '" + c.name() + "' uses a " + m.tokenizer + " vocabulary of " +
                             std::to_string(m.vocab_size) + " ids but model.vocab_size is " +
                             std::to_string(model_vocab) + ": token ids would fall outside the model");
}

}  // namespace

std::vector<std::string> data_spec_words(const std::vector<std::string>& entries) {
  std::vector<std::string> words;
  for (const auto& e : entries) {
    const size_t first = e.find_first_not_of(" \t\r\n"), last = e.find_last_not_of(" \t\r\n");
    if (first == std::string::npos) continue;
    std::istringstream in(e);
    std::string head;
    in >> head;
    double v;
    if (!parse_number(head, v)) {
      words.push_back(e.substr(first, last - first + 1));
      continue;
    }
    words.push_back(head);
    for (std::string w; in >> w;) words.push_back(w);
  }
  return words;
}

std::vector<DataBlendEntry> parse_data_spec(const std::vector<std::string>& entries, const std::string& what) {
  const std::vector<std::string> words = data_spec_words(entries);
  if (words.empty()) throw std::runtime_error(what + ": no data shards given");
  std::vector<DataBlendEntry> out;
  double v;
  if (!parse_number(words[0], v)) {
    for (const auto& w : words)
      if (parse_number(w, v))
        throw std::runtime_error(what + " '" + join(words) + "': weight '" + w +
                                 "' in an unweighted list; give a weight before every path (\"0.7 A 0.3 B\")");
    out.push_back({1.0, words});
    return out;
  }
  if (words.size() % 2 != 0)
    throw std::runtime_error(what + " '" + join(words) + "': expected weight/path pairs (\"0.7 A 0.3 B\")");
  for (size_t k = 0; k < words.size(); k += 2) {
    if (!parse_number(words[k], v) || !(v >= 0) || !std::isfinite(v))
      throw std::runtime_error(what + " '" + join(words) + "': '" + words[k] + "' is not a finite non-negative weight");
    if (parse_number(words[k + 1], v))
      throw std::runtime_error(what + " '" + join(words) + "': expected a path after weight '" + words[k] + "'");
    double w = std::strtod(words[k].c_str(), nullptr);
    out.push_back({w, {words[k + 1]}});
  }
  double sum = 0;
  for (const auto& e : out) sum += e.weight;
  if (sum <= 0) throw std::runtime_error(what + " '" + join(words) + "': the weights sum to zero");
  return out;
}

std::unique_ptr<SampleSource> make_shard_source(const std::vector<std::string>& paths_or_prefixes,
                                                const std::string& split_name, const std::string& split,
                                                int64_t seq_length, uint64_t seed,
                                                const std::string& expected_tokenizer, int64_t model_vocab_size) {
  int part = split_name == "train" ? 0 : split_name == "valid" ? 1 : split_name == "test" ? 2 : split_name == "all" ? 3 : -1;
  if (part < 0)
    throw std::invalid_argument("split name '" + split_name + "' is not one of train, valid, test, all");
  if (seq_length <= 0) throw std::invalid_argument("seq_length must be positive");
  std::array<double, 3> weights{1, 0, 0};
  if (part < 3) weights = parse_split(split);
  auto spec = parse_data_spec(paths_or_prefixes, "data (" + split_name + ")");

  std::vector<std::unique_ptr<SampleSource>> parts;
  std::vector<double> blend_weights;
  std::string first_tokenizer;
  for (const auto& entry : spec) {
    auto corpus = std::make_shared<const ShardCorpus>(entry.paths);
    check_tokenizer(*corpus, expected_tokenizer, model_vocab_size);
    std::string tok = corpus->meta().tokenizer + "@" + corpus->meta().tokenizer_hash;
    if (first_tokenizer.empty()) first_tokenizer = tok;
    if (tok != first_tokenizer)
      throw std::runtime_error("data blend mixes tokenizers: '" + spec.front().paths.front() + "' uses " +
                               first_tokenizer + ", '" + corpus->name() + "' uses " + tok);
    int64_t lo = 0, hi = corpus->num_docs();
    std::string label = "'" + corpus->name() + "' ";
    if (part < 3) {
      auto b = split_boundaries(weights, corpus->num_docs());
      lo = b[part], hi = b[part + 1];
      label += split_name + " split of " + split;
    } else {
      label += "(all documents)";
    }
    parts.push_back(std::make_unique<SplitSource>(corpus, lo, hi, seq_length, seed, label));
    blend_weights.push_back(entry.weight);
  }
  if (parts.size() == 1) return std::move(parts.front());
  return std::make_unique<BlendSource>(std::move(parts), std::move(blend_weights));
}

ShardDataInfo read_shard_data_info(const std::vector<std::string>& paths_or_prefixes) {
  ShardDataInfo info;
  for (const auto& entry : parse_data_spec(paths_or_prefixes)) {
    ShardCorpus c(entry.paths);
    if (info.num_shards == 0) {
      info.tokenizer = c.meta().tokenizer;
      info.tokenizer_hash = c.meta().tokenizer_hash;
      info.vocab_size = c.meta().vocab_size;
      info.eod_id = c.meta().eod_id;
    }
    info.num_shards += int64_t(c.num_shards());
    info.num_docs += c.num_docs();
    info.num_tokens += c.num_tokens();
  }
  return info;
}

}  // namespace gpt
