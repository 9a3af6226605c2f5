// The CUDA backend's linear layers against the CPU backend: cuBLASLt with its bias and GELU epilogues (or
// the cublasGemmEx path where it declines), at small, odd and model shapes, fp32, bf16 and fp16.
#include "tests/cuda_test_util.h"

namespace gpt {

// ---------------------------------------------------------------------------------------------------
// Linear

TEST_P(CudaVsCpuDtype, LinearForwardBackward) {
  const DType dt = GetParam();
  const int64_t N = 37, in = 64, out = 48;
  Pair x = randn_pair({N, in}, dt), w = randn_pair({out, in}, dt, 0.2f), b = randn_pair({out}, dt);
  Pair y = empty({N, out}, dt);
  cpu->linear_forward(x.c, w.c, &b.c, y.c);
  gpu->linear_forward(x.g, w.g, &b.g, y.g);
  expect_close(y, tol(dt), "y with bias");
  cpu->linear_forward(x.c, w.c, nullptr, y.c);
  gpu->linear_forward(x.g, w.g, nullptr, y.g);
  expect_close(y, tol(dt), "y without bias");

  Pair dy = randn_pair({N, out}, dt);
  Pair dx = empty({N, in}, dt);
  Pair dw = randn_pair({out, in}), db = randn_pair({out});  // fp32 gradients, accumulated into
  cpu->linear_backward(dy.c, x.c, w.c, &dx.c, dw.c, &db.c);
  gpu->linear_backward(dy.g, x.g, w.g, &dx.g, dw.g, &db.g);
  expect_close(dx, tol(dt), "dx");
  expect_close(dw, tol(dt), "dw (accumulated)");
  expect_close(db, tol(dt), "db (accumulated)");
  cpu->linear_backward(dy.c, x.c, w.c, nullptr, dw.c, nullptr);
  gpu->linear_backward(dy.g, x.g, w.g, nullptr, dw.g, nullptr);
  expect_close(dw, tol(dt), "dw without dx and db");
  Pair dx_alone = empty({N, in}, dt);  // the input gradient on its own (the tensor-parallel overlap's blocks)
  cpu->linear_backward_input(dy.c, w.c, dx_alone.c);
  gpu->linear_backward_input(dy.g, w.g, dx_alone.g);
  expect_close(dx_alone, tol(dt), "dx alone");
}

// The MLP's fc1 + GELU and fc2's backward through GELU (cuBLASLt's GELU_AUX_BIAS and DGELU epilogues)
// against the CPU's composed ops, at a GPT-2-small MLP's width over 512 rows, with and without fc1's bias
// (16-bit; fp32 runs the composed ops on the GPU too).
TEST_P(CudaVsCpuDtype, LinearGeluEpilogues) {
  const DType dt = GetParam();
  const int64_t N = 512, h = 768, ffn = 3072;
  for (bool bias : {true, false}) {
    const std::string at = std::string(dtype_name(dt)) + (bias ? " with bias" : " without bias");
    Pair x = randn_pair({N, h}, dt), w1 = randn_pair({ffn, h}, dt, 0.05f), b1 = randn_pair({ffn}, dt);
    Pair w2 = randn_pair({h, ffn}, dt, 0.02f);
    Pair pre = empty({N, ffn}, dt), act = empty({N, ffn}, dt);
    const size_t fused_before = fused_products();
    cpu->linear_gelu_forward(x.c, w1.c, bias ? &b1.c : nullptr, pre.c, act.c);
    gpu->linear_gelu_forward(x.g, w1.g, bias ? &b1.g : nullptr, pre.g, act.g);
    expect_close(pre, tol(dt), "linear+gelu pre " + at);
    expect_close(act, tol(dt), "linear+gelu act " + at);
    // fc2's backward from the same act and pre on both sides (the GPU's own, copied to the CPU).
    cpu->upload(host(*gpu, act.g).data(), act.c);
    cpu->upload(host(*gpu, pre.g).data(), pre.c);
    Pair dy = randn_pair({N, h}, dt, 0.1f), dpre = empty({N, ffn}, dt);
    Pair dw = randn_pair({h, ffn}, DType::F32, 0.1f), db = randn_pair({h}, DType::F32, 0.1f);
    cpu->linear_dgelu_backward(dy.c, act.c, w2.c, pre.c, dpre.c, dw.c, &db.c);
    gpu->linear_dgelu_backward(dy.g, act.g, w2.g, pre.g, dpre.g, dw.g, &db.g);
    // fp32: dy . w sums 768 products, then gelu' (seen 9e-6 on an H200).
    expect_close(dpre, dt == DType::F32 ? 5e-5 : 2e-2, "linear dgelu dpre " + at);
    expect_close(dw, tol(dt), "linear dgelu dw (accumulated) " + at);
    expect_close(db, tol(dt), "linear dgelu db (accumulated) " + at);
    std::printf("[info] GELU epilogue products %s: %zu of 2\n", at.c_str(), fused_products() - fused_before);
#ifdef GPT_HAVE_CUDA
    EXPECT_EQ(fused_products() - fused_before, dt == DType::F32 ? 0u : 2u)  // fp32 composes the exact ops
        << "GELU epilogue products (" << at << ")";
#endif
  }
}

TEST_P(CudaVsCpuDtype, LinearWithFp32LogitsLikeTheLmHead) {
  // x and w in the compute dtype, logits and their gradient in fp32.
  const DType dt = GetParam();
  const int64_t N = 50, in = 32, V = 200;
  Pair x = randn_pair({N, in}, dt), w = randn_pair({V, in}, dt, 0.3f);
  Pair logits = empty({N, V});
  cpu->linear_forward(x.c, w.c, nullptr, logits.c);
  gpu->linear_forward(x.g, w.g, nullptr, logits.g);
  expect_close(logits, tol(dt), "fp32 logits");
  Pair dlogits = randn_pair({N, V}, DType::F32, 0.01f);
  Pair dx = empty({N, in}, dt), dw = empty({V, in});
  cpu->fill(dw.c, 0.f);
  gpu->fill(dw.g, 0.f);
  cpu->linear_backward(dlogits.c, x.c, w.c, &dx.c, dw.c, nullptr);
  gpu->linear_backward(dlogits.g, x.g, w.g, &dx.g, dw.g, nullptr);
  // 16-bit weights meet the fp32 gradient in 16 bits on the GPU, which costs one extra rounding.
  expect_close(dx, dt == DType::F32 ? 1e-5 : 2e-2, "dx");
  expect_close(dw, dt == DType::F32 ? 1e-5 : 2e-2, "dw");
}

TEST_F(CudaVsCpu, LinearEmptyShapes) {
  Pair x = empty({0, 8}), w = randn_pair({5, 8}), y = empty({0, 5});
  gpu->linear_forward(x.g, w.g, nullptr, y.g);
  Pair x2 = empty({3, 0}), w2 = empty({5, 0}), y2 = empty({3, 5}), b = randn_pair({5});
  cpu->linear_forward(x2.c, w2.c, &b.c, y2.c);
  gpu->linear_forward(x2.g, w2.g, &b.g, y2.g);
  expect_close(y2, 0, "bias only");
  EXPECT_THROW(gpu->linear_forward(x2.g, w.g, nullptr, y2.g), std::runtime_error);  // in-features differ
}

// The linear layer at the model's shapes, where cuBLASLt runs with its fused bias epilogues (or falls back
// to cublasGemmEx), against the CPU backend on slices: whole products on the CPU would take minutes, so y
// and dx are checked on a sample of rows and dw and db (accumulated into) on a sample of output features,
// each slice computed in full by the CPU backend from the same inputs.
void CudaVsCpu::linear_at_scale(DType dt, int64_t N, int64_t in, int64_t out, bool bias) {
  const std::string name = std::string(dtype_name(dt)) + " " + std::to_string(N) + "x" + std::to_string(in) + "x" +
                           std::to_string(out) + (bias ? " with bias" : " without bias");
  const int64_t samples = 24;
  std::vector<int64_t> rows, feats;  // evenly spread, the first and the last included
  for (int64_t i = 0; i < samples; ++i) rows.push_back(i * (N - 1) / (samples - 1));
  for (int64_t i = 0; i < samples; ++i) feats.push_back(i * (out - 1) / (samples - 1));
  const int64_t R = samples, O = samples;
  const Vec vx = randn(N * in), vw = randn(out * in, 0.02f), vb = randn(out), vdy = randn(N * out, 0.01f);
  const Vec vdw = randn(out * in, 0.1f), vdb = randn(out, 0.1f);

  // The GPU on the whole problem.
  Tensor x = gpu->empty({N, in}, dt), w = gpu->empty({out, in}, dt), b = gpu->empty({out}, dt);
  Tensor y = gpu->empty({N, out}, dt), dy = gpu->empty({N, out}, dt), dx = gpu->empty({N, in}, dt);
  Tensor dw = gpu->empty({out, in}), db = gpu->empty({out});
  gpu->upload(vx.data(), x);
  gpu->upload(vw.data(), w);
  gpu->upload(vb.data(), b);
  gpu->upload(vdy.data(), dy);
  gpu->upload(vdw.data(), dw);
  gpu->upload(vdb.data(), db);
  gpu->linear_forward(x, w, bias ? &b : nullptr, y);
  gpu->linear_backward(dy, x, w, &dx, dw, bias ? &db : nullptr);
  const Vec gy = host(*gpu, y), gdx = host(*gpu, dx), gdw = host(*gpu, dw), gdb = host(*gpu, db);

  // The CPU on the slices: y and dx for the sampled rows; dw and db for the sampled output features.
  Vec sx(R * in), sdy(R * out), cdy(N * O), sw(O * in), sdw(O * in), sdb(O), sb(O);
  for (int64_t i = 0; i < R; ++i) {
    std::copy_n(vx.begin() + rows[i] * in, in, sx.begin() + i * in);
    std::copy_n(vdy.begin() + rows[i] * out, out, sdy.begin() + i * out);
  }
  for (int64_t j = 0; j < O; ++j) {
    std::copy_n(vw.begin() + feats[j] * in, in, sw.begin() + j * in);
    std::copy_n(vdw.begin() + feats[j] * in, in, sdw.begin() + j * in);
    sdb[j] = vdb[feats[j]];
    for (int64_t r = 0; r < N; ++r) cdy[r * O + j] = vdy[r * out + feats[j]];
  }
  auto up = [&](const Shape& s, const Vec& v, DType t) {
    Tensor c = cpu->empty(s, t);
    cpu->upload(v.data(), c);
    return c;
  };
  Tensor cx = up({R, in}, sx, dt), cw = up({out, in}, vw, dt), cb = up({out}, vb, dt);
  Tensor cy = cpu->empty({R, out}, dt), cdx = cpu->empty({R, in}, dt), scratch = cpu->empty({out, in});
  cpu->linear_forward(cx, cw, bias ? &cb : nullptr, cy);
  cpu->fill(scratch, 0.f);
  Tensor cdys = up({R, out}, sdy, dt);
  cpu->linear_backward(cdys, cx, cw, &cdx, scratch, nullptr);
  Tensor fx = up({N, in}, vx, dt), fw = up({O, in}, sw, dt), fdy = up({N, O}, cdy, dt);
  Tensor fdw = up({O, in}, sdw, DType::F32), fdb = up({O}, sdb, DType::F32);
  cpu->linear_backward(fdy, fx, fw, nullptr, fdw, bias ? &fdb : nullptr);

  Vec py(R * out), pdx(R * in), pdw(O * in), pdb(O);
  for (int64_t i = 0; i < R; ++i) {
    std::copy_n(gy.begin() + rows[i] * out, out, py.begin() + i * out);
    std::copy_n(gdx.begin() + rows[i] * in, in, pdx.begin() + i * in);
  }
  for (int64_t j = 0; j < O; ++j) {
    std::copy_n(gdw.begin() + feats[j] * in, in, pdw.begin() + j * in);
    pdb[j] = gdb[feats[j]];
  }
  // fp32 sums over up to 8192 terms in a different order: a little above the small shapes' 1e-5.
  const double t = dt == DType::F32 ? 3e-5 : 1e-2;
  expect_close(host(*cpu, cy), py, t, "y " + name);
  expect_close(host(*cpu, cdx), pdx, t, "dx " + name);
  expect_close(host(*cpu, fdw), pdw, t, "dw (accumulated) " + name);
  if (bias) {
    expect_close(host(*cpu, fdb), pdb, t, "db (accumulated) " + name);
  } else {
    EXPECT_EQ(gdb, vdb) << "db untouched without a bias";
  }
#ifdef GPT_HAVE_CUDA
  if (auto* cb = dynamic_cast<CudaBackend*>(gpu)) std::printf("[info] cuBLASLt plans cached: %zu\n", cb->lt_plans());
#endif
}

TEST_P(CudaVsCpuDtype, LinearAtModelShapes) {
  const DType dt = GetParam();
  // The MLP's projections at half the rows, with bias only: the host side of these checks (random
  // operands, sliced CPU references) is what takes the time, and gpu-check runs the binary under a timeout.
  linear_at_scale(dt, 4096, 2048, 8192, true);  // the MLP's up projection
  linear_at_scale(dt, 4096, 8192, 2048, true);  // and its down projection
  for (bool bias : {true, false}) {
    linear_at_scale(dt, 8192, 2048, 2048, bias);
    linear_at_scale(dt, 1000, 333, 517, bias);    // odd sizes: unaligned rows, no tile fits exactly
  }
}

TEST_P(CudaVsCpuDtype, LinearRepeatsAndFallsBackWhenTheBiasIsMisaligned) {
  // The same problem twice (the second from the plan cache) and once with a bias one element into its
  // storage: cuBLASLt's bias epilogue wants 16-byte alignment, so that call takes the cublasGemmEx path.
  const DType dt = GetParam();
  const int64_t N = 300, in = 96, out = 160;
  Pair x = randn_pair({N, in}, dt), w = randn_pair({out, in}, dt, 0.1f), dy = randn_pair({N, out}, dt);
  Pair bias_store = randn_pair({out + 1}, dt);
  Pair b{bias_store.c.slice_elems(1, {out}), bias_store.g.slice_elems(1, {out})};
  Pair y = empty({N, out}, dt), dx = empty({N, in}, dt), dw = randn_pair({out, in}), db = randn_pair({out});
  for (int rep = 0; rep < 2; ++rep) {
    cpu->linear_forward(x.c, w.c, &b.c, y.c);
    gpu->linear_forward(x.g, w.g, &b.g, y.g);
    expect_close(y, tol(dt), "y, misaligned bias, call " + std::to_string(rep));
    cpu->linear_backward(dy.c, x.c, w.c, &dx.c, dw.c, &db.c);
    gpu->linear_backward(dy.g, x.g, w.g, &dx.g, dw.g, &db.g);
    expect_close(dx, tol(dt), "dx, call " + std::to_string(rep));
    expect_close(dw, tol(dt), "dw (accumulated twice), call " + std::to_string(rep));
    expect_close(db, tol(dt), "db (accumulated twice), call " + std::to_string(rep));
  }
  // A misaligned db: the epilogue writes an aligned scratch, so this must match as well.
  Pair db_store = randn_pair({out + 1});
  Pair db1{db_store.c.slice_elems(1, {out}), db_store.g.slice_elems(1, {out})};
  cpu->linear_backward(dy.c, x.c, w.c, nullptr, dw.c, &db1.c);
  gpu->linear_backward(dy.g, x.g, w.g, nullptr, dw.g, &db1.g);
  expect_close(db1, tol(dt), "db at an offset");
  expect_close(dw, tol(dt), "dw (accumulated three times)");
}

}  // namespace gpt
