// The CUDA backend against the CPU backend (the reference, itself checked against finite differences and
// PyTorch in ops_test and model_test): the factory, the bf16/fp16 casts bit for bit, the caching allocator's
// counters, token uploads through the pinned staging ring, norms, element-wise ops, the embedding, cross-entropy and optimizer ops on the same random
// inputs (fp32 to 1e-5, bf16 to 1e-2 relative to |reference| + its RMS), reductions reproducible, and
// device-side input errors raised. Linear layers, attention and the whole model have files of their own
// (cuda_linear_test, cuda_attention_test, cuda_model_test); all build into one binary, cuda_ops_test.
// GPU tests skip when the CUDA backend is not built in or no device is visible; the factory's error
// message and the host half of the conversions are checked everywhere.
#include "tests/cuda_test_util.h"

namespace gpt {

TEST(CudaFactory, CreatesTheBackendOrExplainsWhyNot) {
  std::string why;
  Backend* be = cuda_backend(&why);
  if (be) {
    EXPECT_EQ(be->name(), "cuda");
    EXPECT_EQ(be->device(), Device::CUDA);
    return;
  }
#ifdef GPT_HAVE_CUDA
  EXPECT_NE(why.find("backend cuda: no CUDA device is visible ("), std::string::npos) << why;
#else
  EXPECT_NE(why.find("not built into this binary"), std::string::npos) << why;
#endif
}

#ifdef GPT_HAVE_CUDA
// The kernels' conversions (cuda_half.cuh) compiled for the host: bit for bit those of half.h.
TEST(CudaHalf, HostConversionsMatchHalfH) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    const float a1 = bf16_to_fp32(b), a2 = cuda::bf16_to_f32(b);
    const float f1 = fp16_to_fp32(b), f2 = cuda::f16_to_f32(b);
    ASSERT_EQ(std::memcmp(&a1, &a2, 4), 0) << "bf16 bits " << h;
    ASSERT_EQ(std::memcmp(&f1, &f2, 4), 0) << "fp16 bits " << h;
  }
  std::mt19937 rng(5);
  std::vector<uint32_t> patterns = {0u,          0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                    0xffffffffu, 0x00000001u, 0x33000000u, 0x33000001u, 0x387fe000u, 0x38800000u,
                                    0x477fe000u, 0x477ff000u, 0x477fefffu, 0x3f808000u, 0x3f818000u, 0x7f7fffffu};
  for (int i = 0; i < 2000000; ++i) patterns.push_back(rng());
  for (uint32_t u : patterns) {
    float f;
    std::memcpy(&f, &u, 4);
    ASSERT_EQ(fp32_to_bf16(f), cuda::f32_to_bf16(f)) << std::hex << u;
    ASSERT_EQ(fp32_to_fp16(f), cuda::f32_to_f16(f)) << std::hex << u;
  }
}
#endif


// ---------------------------------------------------------------------------------------------------
// Memory, casts, counters

TEST_F(CudaVsCpu, CastsAreBitExactIncludingSpecialValues) {
  Vec v = randn(10007, 3.f);
  const float inf = std::numeric_limits<float>::infinity();
  const Vec special = {0.f,     -0.f,    inf,     -inf,     1e-8f,  -1e-8f, 6e-8f,  65504.f, 65519.f,
                       65520.f, 1e30f,   -1e30f,  1.00390625f, 1.01171875f, 3e-39f, 5.9604645e-8f, 2.9802322e-8f};
  v.insert(v.end(), special.begin(), special.end());
  const int64_t n = static_cast<int64_t>(v.size());
  Pair f = make({n}, v);
  for (DType dt : {DType::BF16, DType::F16}) {
    Pair h = empty({n}, dt);
    cpu->copy(f.c, h.c);
    gpu->copy(f.g, h.g);
    const Vec c = host(*cpu, h.c), g = host(*gpu, h.g);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::memcmp(&c[i], &g[i], 4), 0) << dtype_name(dt) << " element " << i << " from " << v[i];
    // Round trip back to F32 and across 16-bit types.
    Pair back = empty({n}, DType::F32);
    cpu->copy(h.c, back.c);
    gpu->copy(h.g, back.g);
    EXPECT_EQ(host(*cpu, back.c), host(*gpu, back.g));
    Pair other = empty({n}, dt == DType::BF16 ? DType::F16 : DType::BF16);
    cpu->copy(h.c, other.c);
    gpu->copy(h.g, other.g);
    const Vec oc = host(*cpu, other.c), og = host(*gpu, other.g);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(std::memcmp(&oc[i], &og[i], 4), 0) << "16-bit to 16-bit at " << i;
  }
  // NaN stays NaN.
  Vec nan = {std::numeric_limits<float>::quiet_NaN()};
  Pair pn = make({1}, nan, DType::BF16);
  EXPECT_TRUE(std::isnan(host(*gpu, pn.g)[0]));
}

TEST_F(CudaVsCpu, FillAndIntTransfers) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Pair p = empty({1000}, dt);
    cpu->fill(p.c, -1.7f);
    gpu->fill(p.g, -1.7f);
    EXPECT_EQ(host(*cpu, p.c), host(*gpu, p.g));
    cpu->fill(p.c, 0.f);
    gpu->fill(p.g, 0.f);
    EXPECT_EQ(host(*cpu, p.c), host(*gpu, p.g));
  }
  std::vector<int32_t> ids(777);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 7919 % 1000) - 300;
  Tensor t = gpu->empty({777}, DType::I32);
  gpu->upload_i32(ids.data(), t);
  std::vector<int32_t> back(777);
  gpu->download_i32(t, back.data());
  EXPECT_EQ(ids, back);
  gpu->fill(t, 42.f);
  gpu->download_i32(t, back.data());
  EXPECT_EQ(back, std::vector<int32_t>(777, 42));
  EXPECT_THROW(gpu->fill(t, 0.5f), std::runtime_error);
  // A host tensor handed to the GPU backend is refused, not dereferenced.
  Tensor h = cpu->empty({4});
  EXPECT_THROW(gpu->fill(h, 1.f), std::runtime_error);
}

// Token uploads go through the backend's page-locked staging ring: more uploads than slots, of growing
// and shrinking sizes, each from a host buffer overwritten as soon as upload_i32 returns and each queued
// behind work on the stream, all arrive as they were when uploaded.
TEST_F(CudaVsCpu, PinnedUploadsKeepEachUploadsData) {
  std::vector<int32_t> source;
  std::vector<Tensor> uploaded;
  std::vector<std::vector<int32_t>> expected;
  Tensor busy = gpu->empty({1 << 20});
  for (int i = 0; i < 150; ++i) {
    const size_t n = 1 + static_cast<size_t>((i * 2654435761u) % 5000);
    source.assign(n, 0);
    for (size_t k = 0; k < n; ++k) source[k] = static_cast<int32_t>(i * 100003 + k);
    gpu->fill(busy, static_cast<float>(i));  // work ahead of the copy on the stream
    Tensor t = gpu->empty({static_cast<int64_t>(n)}, DType::I32);
    gpu->upload_i32(source.data(), t);
    expected.push_back(source);
    std::fill(source.begin(), source.end(), -1);  // the caller may reuse its buffer at once
    uploaded.push_back(t);
  }
  for (size_t i = 0; i < uploaded.size(); ++i) {
    std::vector<int32_t> back(expected[i].size());
    gpu->download_i32(uploaded[i], back.data());
    ASSERT_EQ(back, expected[i]) << "upload " << i;
  }
}

TEST_F(CudaVsCpu, CachingAllocatorReusesBlocksAndCounts) {
#ifdef GPT_HAVE_CUDA
  auto* cb = dynamic_cast<CudaBackend*>(gpu);
  ASSERT_NE(cb, nullptr);
  const size_t before = gpu->memory_in_use();
  gpu->reset_memory_peak();
  {
    Tensor a = gpu->empty({1 << 20});  // 4 MiB
    EXPECT_GE(gpu->memory_in_use(), before + (4u << 20));
    EXPECT_GE(gpu->memory_peak(), before + (4u << 20));
  }
  EXPECT_EQ(gpu->memory_in_use(), before);
  {
    Tensor warm = gpu->empty({300});  // the small block may not be cached yet
  }
  const int64_t mallocs = cb->device_allocations();
  for (int i = 0; i < 10; ++i) {
    Tensor a = gpu->empty({1 << 20});
    Tensor b = gpu->empty({300});
  }
  EXPECT_EQ(cb->device_allocations(), mallocs) << "a repeated allocation pattern must be served from the cache";
  EXPECT_GE(cb->memory_reserved(), gpu->memory_in_use());
#endif
}

// ---------------------------------------------------------------------------------------------------
// LayerNorm, GELU, elementwise

TEST_P(CudaVsCpuDtype, LayerNormForwardBackward) {
  const DType dt = GetParam();
  for (int64_t C : {8, 100, 768}) {
    const int64_t N = 131;
    Pair x = make({N, C}, [&] {
      Vec v = randn(N * C, 2.f);
      for (auto& e : v) e += 0.5f;
      return v;
    }(), dt);
    Pair gamma = randn_pair({C}, dt), beta = randn_pair({C}, dt);
    Pair y = empty({N, C}, dt), mean = empty({N}), rstd = empty({N});
    cpu->layernorm_forward(x.c, gamma.c, beta.c, y.c, mean.c, rstd.c, 1e-5f);
    gpu->layernorm_forward(x.g, gamma.g, beta.g, y.g, mean.g, rstd.g, 1e-5f);
    const std::string at = " C=" + std::to_string(C);
    expect_close(y, tol(dt), "y" + at);
    expect_close(mean, 1e-5, "mean" + at);
    expect_close(rstd, 1e-5, "rstd" + at);
    Pair dy = randn_pair({N, C}, dt), dx = empty({N, C}, dt);
    Pair dgamma = randn_pair({C}), dbeta = randn_pair({C});
    cpu->layernorm_backward(dy.c, x.c, gamma.c, mean.c, rstd.c, dx.c, dgamma.c, dbeta.c);
    gpu->layernorm_backward(dy.g, x.g, gamma.g, mean.g, rstd.g, dx.g, dgamma.g, dbeta.g);
    expect_close(dx, tol(dt), "dx" + at);
    expect_close(dgamma, tol(dt), "dgamma" + at);
    expect_close(dbeta, tol(dt), "dbeta" + at);
  }
}

// The residual add fused with LayerNorm (forward: h = x + r, then LayerNorm of h; backward: dx = LayerNorm's
// dx + dres): the same bits as the GPU's separate add, layernorm and accumulate, and close to the CPU.
TEST_P(CudaVsCpuDtype, AddLayerNormFusedMatchesSeparateOps) {
  const DType dt = GetParam();
  for (int64_t C : {8, 100, 2048}) {
    const int64_t N = 131;
    const std::string at = std::string(" ") + dtype_name(dt) + " C=" + std::to_string(C);
    Pair x = randn_pair({N, C}, dt, 2.f), r = randn_pair({N, C}, dt), gamma = randn_pair({C}, dt);
    Pair beta = randn_pair({C}, dt);
    Pair h = empty({N, C}, dt), y = empty({N, C}, dt), mean = empty({N}), rstd = empty({N});
    cpu->add_layernorm_forward(x.c, r.c, gamma.c, beta.c, h.c, y.c, mean.c, rstd.c, 1e-5f);
    gpu->add_layernorm_forward(x.g, r.g, gamma.g, beta.g, h.g, y.g, mean.g, rstd.g, 1e-5f);
    expect_close(h, tol(dt), "add+layernorm h" + at);
    expect_close(y, tol(dt), "add+layernorm y" + at);
    expect_close(rstd, 1e-5, "add+layernorm rstd" + at);
    Tensor h2 = gpu->empty({N, C}, dt), y2 = gpu->empty({N, C}, dt), m2 = gpu->empty({N}), r2 = gpu->empty({N});
    gpu->add(x.g, r.g, h2);
    gpu->layernorm_forward(h2, gamma.g, beta.g, y2, m2, r2, 1e-5f);
    EXPECT_EQ(host(*gpu, h.g), host(*gpu, h2)) << "h" << at;
    EXPECT_EQ(host(*gpu, y.g), host(*gpu, y2)) << "y" << at;

    Pair dy = randn_pair({N, C}, dt), dres = randn_pair({N, C}, dt), dx = empty({N, C}, dt);
    Pair dgamma = randn_pair({C}), dbeta = randn_pair({C});
    const Vec dg0 = host(*gpu, dgamma.g), db0 = host(*gpu, dbeta.g);
    cpu->layernorm_backward_add(dy.c, h.c, gamma.c, mean.c, rstd.c, dres.c, dx.c, dgamma.c, dbeta.c);
    gpu->layernorm_backward_add(dy.g, h.g, gamma.g, mean.g, rstd.g, dres.g, dx.g, dgamma.g, dbeta.g);
    expect_close(dx, tol(dt), "layernorm+residual dx" + at);
    expect_close(dgamma, tol(dt), "layernorm+residual dgamma" + at);
    Tensor dx2 = gpu->empty({N, C}, dt), dg2 = gpu->empty({C}), db2 = gpu->empty({C});
    gpu->upload(dg0.data(), dg2);
    gpu->upload(db0.data(), db2);
    gpu->layernorm_backward(dy.g, h.g, gamma.g, mean.g, rstd.g, dx2, dg2, db2);
    gpu->accumulate(dres.g, dx2);
    EXPECT_EQ(host(*gpu, dx.g), host(*gpu, dx2)) << "dx" << at;
    EXPECT_EQ(host(*gpu, dgamma.g), host(*gpu, dg2)) << "dgamma" << at;
  }
}

TEST_P(CudaVsCpuDtype, GeluAndElementwise) {
  const DType dt = GetParam();
  const int64_t n = 100003;
  Pair x = randn_pair({n}, dt, 2.f), y = empty({n}, dt);
  cpu->gelu_forward(x.c, y.c);
  gpu->gelu_forward(x.g, y.g);
  expect_close(y, tol(dt), "gelu");
  Pair dy = randn_pair({n}, dt), dx = empty({n}, dt);
  cpu->gelu_backward(dy.c, x.c, dx.c);
  gpu->gelu_backward(dy.g, x.g, dx.g);
  expect_close(dx, tol(dt), "gelu backward");
  Pair a = randn_pair({n}, dt), out = empty({n}, dt);
  cpu->add(a.c, x.c, out.c);
  gpu->add(a.g, x.g, out.g);
  expect_close(out, tol(dt), "add");
  Pair acc = randn_pair({n});  // fp32 destination, 16-bit source: the residual-gradient pattern
  cpu->accumulate(a.c, acc.c);
  gpu->accumulate(a.g, acc.g);
  expect_close(acc, 1e-6, "accumulate");
  cpu->scale(out.c, -0.37f);
  gpu->scale(out.g, -0.37f);
  expect_close(out, tol(dt), "scale");
}

// ---------------------------------------------------------------------------------------------------
// Embedding

TEST_P(CudaVsCpuDtype, EmbeddingShardAndPositions) {
  const DType dt = GetParam();
  const int64_t B = 3, T = 11, C = 40, rows = 32, vocab_start = 16;
  std::vector<int32_t> ids(B * T);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % 64);  // half of them outside the shard
  ids[0] = ids[5] = ids[9] = 20;                               // repeated ids accumulate
  Pair idp = ints({B * T}, ids);
  Pair table = randn_pair({rows, C}, dt), out = empty({B * T, C}, dt);
  cpu->embedding_forward(idp.c, table.c, vocab_start, out.c);
  gpu->embedding_forward(idp.g, table.g, vocab_start, out.g);
  expect_close(out, 0, "embedding forward (a copy)");
  Pair pos = randn_pair({T + 5, C}, dt);
  cpu->add_positions(pos.c, T, out.c);
  gpu->add_positions(pos.g, T, out.g);
  expect_close(out, tol(dt), "add_positions");

  Pair dout = randn_pair({B * T, C}, dt), dtable = randn_pair({rows, C}), dpos = randn_pair({T + 5, C});
  cpu->embedding_backward(idp.c, dout.c, vocab_start, dtable.c);
  gpu->embedding_backward(idp.g, dout.g, vocab_start, dtable.g);
  expect_close(dtable, 0, "embedding backward (the CPU's order of additions, bit for bit)");
  cpu->add_positions_backward(dout.c, T, dpos.c);
  gpu->add_positions_backward(dout.g, T, dpos.g);
  expect_close(dpos, 1e-6, "add_positions backward");
}

// A batch of 8192 ids from 8 distinct values (runs of ~1000 repeats): the token gradient is the same bit
// for bit as the CPU's and from one call to the next, whatever the scheduling.
TEST_P(CudaVsCpuDtype, EmbeddingBackwardIsDeterministic) {
  const DType dt = GetParam();
  const int64_t N = 8192, C = 768, rows = 8;
  std::vector<int32_t> ids(N);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % rows);
  Pair idp = ints({N}, ids);
  Pair dout = randn_pair({N, C}, dt), dtable = randn_pair({rows, C});
  const Vec start = host(*gpu, dtable.g);
  cpu->embedding_backward(idp.c, dout.c, 0, dtable.c);
  gpu->embedding_backward(idp.g, dout.g, 0, dtable.g);
  expect_close(dtable, 0, "embedding backward, 8192 ids over 8 rows");
  const Vec first = host(*gpu, dtable.g);
  gpu->upload(start.data(), dtable.g);
  gpu->embedding_backward(idp.g, dout.g, 0, dtable.g);
  EXPECT_EQ(host(*gpu, dtable.g), first) << "a second call differs";
}

TEST_F(CudaVsCpu, NegativeTokenIdIsReported) {
  Pair idp = ints({3}, {1, -4, 2});
  Pair table = randn_pair({8, 4}), out = empty({3, 4});
  gpu->embedding_forward(idp.g, table.g, 0, out.g);
  try {
    gpu->synchronize();
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("negative token id -4 at position 1"), std::string::npos) << e.what();
  }
  gpu->synchronize();  // the report is cleared once raised
}

// ---------------------------------------------------------------------------------------------------
// Cross-entropy

TEST_P(CudaVsCpuDtype, VocabParallelCrossEntropyStages) {
  const DType dt = GetParam();
  // A shard holding global ids [50, 150) of a 130-token vocabulary: 80 real columns and 20 of padding.
  const int64_t N = 29, Vl = 100, vocab_start = 50, vocab_size = 130;
  std::vector<int32_t> targets(N);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % vocab_size);
  Pair tg = ints({N}, targets);
  Pair logits = randn_pair({N, Vl}, dt, 3.f);
  Pair row_max = empty({N});
  cpu->ce_row_max(logits.c, vocab_start, vocab_size, row_max.c);
  gpu->ce_row_max(logits.g, vocab_start, vocab_size, row_max.g);
  expect_close(row_max, 0, "row_max (exact)");
  Pair sum_exp = empty({N}), target_logit = empty({N});
  cpu->ce_sum_exp(logits.c, row_max.c, tg.c, vocab_start, vocab_size, sum_exp.c, target_logit.c);
  gpu->ce_sum_exp(logits.g, row_max.g, tg.g, vocab_start, vocab_size, sum_exp.g, target_logit.g);
  expect_close(sum_exp, 1e-5, "sum_exp");
  expect_close(target_logit, 0, "target_logit (exact)");
  // The same statistics in one read of the logits (online softmax on the GPU), and the rescale of a
  // shard's sum to a larger common max.
  Pair stats_max = empty({N}), stats_sum = empty({N}), stats_target = empty({N});
  cpu->ce_row_stats(logits.c, tg.c, vocab_start, vocab_size, stats_max.c, stats_sum.c, stats_target.c);
  gpu->ce_row_stats(logits.g, tg.g, vocab_start, vocab_size, stats_max.g, stats_sum.g, stats_target.g);
  expect_close(stats_max, 0, "ce_row_stats row_max (exact)");
  expect_close(stats_sum, 1e-5, "ce_row_stats sum_exp");
  expect_close(stats_target, 0, "ce_row_stats target_logit (exact)");
  Vec raised = host(*cpu, stats_max.c);
  for (float& m : raised) m += 1.5f;
  Pair common = make({N}, raised);
  cpu->ce_rescale_sum_exp(stats_max.c, common.c, stats_sum.c);
  gpu->ce_rescale_sum_exp(stats_max.g, common.g, stats_sum.g);
  expect_close(stats_sum, 1e-5, "ce_rescale_sum_exp");
  Pair dlogits = empty({N, Vl});
  cpu->ce_backward(logits.c, row_max.c, sum_exp.c, tg.c, vocab_start, vocab_size, 0.25f, dlogits.c);
  gpu->ce_backward(logits.g, row_max.g, sum_exp.g, tg.g, vocab_start, vocab_size, 0.25f, dlogits.g);
  expect_close(dlogits, 1e-5, "dlogits");
  const Vec d = host(*gpu, dlogits.g);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = vocab_size - vocab_start; c < Vl; ++c) ASSERT_EQ(d[n * Vl + c], 0.f) << "padding column " << c;
  // A shard with no real columns: max is -inf.
  Pair far = empty({N});
  gpu->ce_row_max(logits.g, 200, vocab_size, far.g);
  for (float v : host(*gpu, far.g)) EXPECT_EQ(v, -std::numeric_limits<float>::infinity());
}

TEST_F(CudaVsCpu, TargetOutsideTheVocabularyIsReported) {
  Pair tg = ints({2}, {3, 500});
  Pair logits = randn_pair({2, 10}), row_max = empty({2}), sum_exp = empty({2}), tl = empty({2});
  gpu->ce_row_max(logits.g, 0, 10, row_max.g);
  gpu->ce_sum_exp(logits.g, row_max.g, tg.g, 0, 10, sum_exp.g, tl.g);
  Vec out(2);
  try {
    gpu->download(sum_exp.g, out.data());
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("target 500 at row 1 is outside the vocabulary [0, 10)"), std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------------
// Optimizer

TEST_P(CudaVsCpuDtype, SumOfSquaresIsAccurateAndReproducible) {
  const DType dt = GetParam();
  for (int64_t n : {1, 1000, 1000003}) {
    Pair t = randn_pair({n}, dt);
    const double c = cpu->sum_squares(t.c), g1 = gpu->sum_squares(t.g), g2 = gpu->sum_squares(t.g);
    EXPECT_NEAR(g1, c, 1e-12 * c) << "n=" << n;
    EXPECT_EQ(g1, g2) << "n=" << n << ": not reproducible";
  }
}

TEST_F(CudaVsCpu, AdamWSteps) {
  const int64_t n = 50001;
  Pair w = randn_pair({n}), m = empty({n}), v = empty({n});
  cpu->fill(m.c, 0.f), gpu->fill(m.g, 0.f), cpu->fill(v.c, 0.f), gpu->fill(v.g, 0.f);
  for (int64_t step = 1; step <= 3; ++step) {
    Pair g = randn_pair({n}, DType::F32, 0.1f);
    cpu->adamw_step(w.c, g.c, m.c, v.c, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    gpu->adamw_step(w.g, g.g, m.g, v.g, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
  }
  expect_close(w, 1e-5, "w");
  expect_close(m, 1e-5, "m");
  expect_close(v, 1e-5, "v");
  Pair bad = empty({n}, DType::BF16);
  EXPECT_THROW(gpu->adamw_step(bad.g, w.g, m.g, v.g, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1), std::runtime_error);
}

// The flat AdamW over a buffer of segments (padding between two of them), gradient scaling and the bf16
// store fused in, against the CPU's flat step; the padding must stay untouched.
TEST_F(CudaVsCpu, FlatAdamWSteps) {
  const std::vector<ops::FlatSegment> segs = {{0, 70001, 0.1f, -1}, {70001, 70004, 0.f, -1}, {70021, 90000, 0.1f, -1}};
  const int64_t n = 90005;
  Pair w = randn_pair({n}), m = empty({n}), v = empty({n});
  Pair value = make({n}, host(*cpu, w.c), DType::BF16);
  cpu->fill(m.c, 0.f), gpu->fill(m.g, 0.f), cpu->fill(v.c, 0.f), gpu->fill(v.g, 0.f);
  for (int64_t step = 1; step <= 3; ++step) {
    Pair g = randn_pair({n}, DType::F32, 0.1f);
    const ops::AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.37f, step};
    cpu->adamw_step_flat(w.c, g.c, m.c, v.c, &value.c, segs, h);
    gpu->adamw_step_flat(w.g, g.g, m.g, v.g, &value.g, segs, h);
  }
  expect_close(w, 1e-5, "flat AdamW master weights");
  expect_close(m, 1e-5, "flat AdamW m");
  expect_close(v, 1e-5, "flat AdamW v");
  expect_close(value, 1e-2, "flat AdamW bf16 values");
  const Vec wc = host(*cpu, w.c), wg = host(*gpu, w.g);
  for (int64_t i = 70004; i < 70021; ++i) EXPECT_EQ(wg[i], wc[i]) << "padding element " << i;
}

// Per-segment fp64 sums of squares (the gradient norm's) and the loss accumulation, against the CPU.
TEST_F(CudaVsCpu, SegmentSquaresAndLossAccumulation) {
  const std::vector<ops::FlatSegment> segs = {{0, 1000003, 0.f, 2}, {1000003, 1000010, 0.f, -1}, {1000010, 1000500, 0.f, 0}};
  Pair flat = randn_pair({1000500});
  Pair sums = {cpu->zeros({3}, DType::F64), gpu->zeros({3}, DType::F64)};
  cpu->sum_squares_segments(flat.c, segs, sums.c);
  gpu->sum_squares_segments(flat.g, segs, sums.g);
  gpu->sum_squares_segments(flat.g, segs, sums.g);  // accumulates, reproducibly
  double c[3], g[3];
  cpu->download_f64(sums.c, c);
  gpu->download_f64(sums.g, g);
  for (int k : {0, 2}) EXPECT_NEAR(g[k], 2 * c[k], 1e-12 * c[k]) << "slot " << k;
  EXPECT_EQ(g[1], 0.0);
  const int64_t rows = 5000;
  Pair mx = randn_pair({rows}), tl = randn_pair({rows}), se = make({rows}, Vec(rows, 37.5f));
  Pair loss = {cpu->zeros({1}, DType::F64), gpu->zeros({1}, DType::F64)};
  cpu->ce_loss_accumulate(mx.c, se.c, tl.c, loss.c);
  gpu->ce_loss_accumulate(mx.g, se.g, tl.g, loss.g);
  double lc = 0, lg = 0;
  cpu->download_f64(loss.c, &lc);
  gpu->download_f64(loss.g, &lg);
  EXPECT_NEAR(lg, lc, 1e-12 * std::fabs(lc));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaVsCpuDtype, ::testing::Values(DType::F32, DType::BF16), dtype_param_name);

}  // namespace gpt
