// Parameter initialisation runs on every OpenMP thread; each element must still be the pure function of
// (seed, tensor name, global index) it was when one thread filled it. Reference: the element formula
// (counter_normal at ShardSpec::global_index) evaluated here one element at a time, rounded to the
// compute dtype by the backend's upload.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>

#include "model/gpt_model.h"
#include "model/init.h"

using namespace gpt;

namespace {

// The bits of every element of t, read back as fp32.
std::vector<uint32_t> bits_of(Backend& be, const Tensor& t) {
  std::vector<float> v(t.numel());
  be.download(t, v.data());
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

}  // namespace

TEST(ParameterInit, ParallelFillMatchesTheElementFormula) {
  auto be = make_backend("cpu");
  const uint64_t seed = 1234;
  const int saved_threads = omp_get_max_threads();
  for (DType dtype : {DType::F32, DType::BF16})
    for (int threads : {1, 3}) {
      omp_set_num_threads(threads);
      ModelSpec s;
      s.num_layers = 2;
      s.hidden = 128;
      s.heads = 4;
      s.ffn = 512;  // fc1 and fc2 shards of 32768 elements: filled in parallel
      s.seq_length = 16;
      s.vocab_size = 300;
      s.vocab_divisible_by = 256;  // padded to 512 rows at tp 2
      s.tp_size = 2;
      s.tp_rank = 1;  // column, row and fused-qkv shards as well as replicated tensors
      s.dtype = dtype;
      ModelChunk chunk(s, 0, s.num_layers, true, true);
      chunk.allocate_and_init(*be, seed);
      int64_t checked = 0;
      for (auto& p : chunk.params().params()) {
        const int64_t n = p->value.numel();
        std::vector<float> expected(n);
        for (int64_t i = 0; i < n; ++i)
          expected[i] = p->init.normal ? p->init.std * counter_normal(seed, hash_name(p->name),
                                                                      p->shard.global_index(p->global_shape, i))
                                       : p->init.constant;
        Tensor rounded = be->empty(p->value.shape(), dtype);
        be->upload(expected.data(), rounded);
        ASSERT_EQ(bits_of(*be, p->value), bits_of(*be, rounded))
            << p->name << " " << dtype_name(dtype) << " threads " << threads;
        checked += n;
      }
      EXPECT_GT(checked, 200000);
    }
  omp_set_num_threads(saved_threads);
}
