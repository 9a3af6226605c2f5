// Tied-embedding and sequence-parallel gradient reductions.
#include "parallel/data_parallel/grad_sync.h"

namespace gpt {

void reduce_tied_embedding(ParallelState& ps, Backend& backend, const std::vector<ModelChunk*>& chunks) {
  if (ps.pp_size() == 1) {
    for (ModelChunk* c : chunks) c->reduce_tied_gradient_locally(backend);
    return;
  }
  if (!ps.embedding) return;
  for (ModelChunk* c : chunks)
    for (auto& p : c->params().params())
      if (p->tied) ps.embedding->all_reduce(p->grad);
}

void reduce_sequence_parallel_grads(ParallelState& ps, const std::vector<ModelChunk*>& chunks) {
  for (ModelChunk* c : chunks) reduce_sequence_parallel_grads(ps, c->params().all());
}

void reduce_sequence_parallel_grads(ParallelState& ps, const std::vector<Parameter*>& params) {
  if (ps.tp_size() == 1) return;
  for (Parameter* p : params)
    if (p->sequence_parallel_grad) ps.tp->all_reduce(p->grad);
}

}  // namespace gpt
