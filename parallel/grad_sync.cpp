// Tied-embedding reduction, bucketed data-parallel all-reduce, global norm and clipping.
#include "parallel/grad_sync.h"

#include <cmath>

namespace gpt {

void reduce_tied_embedding(ParallelState& ps, Backend& backend, const std::vector<ModelChunk*>& chunks) {
  if (ps.pp_size() == 1) {
    for (ModelChunk* c : chunks) c->reduce_tied_gradient_locally(backend);
    return;
  }
  if (!ps.embedding) return;
  for (ModelChunk* c : chunks)
    for (auto& p : c->params().params())
      if (p->global_id == 0) ps.embedding->all_reduce(p->grad);
}

void reduce_sequence_parallel_grads(ParallelState& ps, const std::vector<ModelChunk*>& chunks) {
  if (ps.tp_size() == 1) return;
  for (ModelChunk* c : chunks)
    for (auto& p : c->params().params())
      if (p->sequence_parallel_grad) ps.tp->all_reduce(p->grad);
}

void all_reduce_data_parallel(ParallelState& ps, const std::vector<ModelChunk*>& chunks, int64_t bucket_bytes) {
  if (ps.dp_size() == 1) return;
  int64_t bucket_elems = std::max<int64_t>(1, bucket_bytes / 4);
  for (ModelChunk* c : chunks) {
    Tensor& buf = c->params().grad_buffer();
    for (int64_t start = 0; start < buf.numel(); start += bucket_elems) {
      int64_t n = std::min(bucket_elems, buf.numel() - start);
      Tensor bucket = buf.slice_elems(start, {n});
      ps.dp->all_reduce(bucket);
    }
  }
}

double global_grad_norm(ParallelState& ps, Backend& backend, const std::vector<ModelChunk*>& chunks,
                        int64_t num_global_params, bool sharded_over_dp) {
  std::vector<double> squares(num_global_params, 0.0);
  for (ModelChunk* c : chunks)
    for (auto& p : c->params().params()) {
      if (p->tied_copy || (p->tp_replicated && ps.tp_rank() != 0)) continue;
      squares.at(p->global_id) += backend.sum_squares(p->grad);
    }
  ps.model_parallel->all_reduce_host(squares.data(), num_global_params);
  if (sharded_over_dp) ps.dp->all_reduce_host(squares.data(), num_global_params);
  double total = 0;
  for (double s : squares) total += s;
  return std::sqrt(total);
}

void clip_gradients(Backend& backend, const std::vector<ModelChunk*>& chunks, double norm, double clip) {
  if (clip <= 0) return;
  double coeff = clip / (norm + 1e-6);
  if (coeff >= 1.0) return;
  for (ModelChunk* c : chunks) backend.scale(c->params().grad_buffer(), static_cast<float>(coeff));
}

}  // namespace gpt
