// Executor of the pipeline schedule tables (parallel/pipeline/pipeline_schedule.h) over this rank's model chunks.
#include "parallel/pipeline/pipeline_executor.h"

#include <map>
#include <memory>

#include "parallel/pipeline/pipeline_schedule.h"
#include "parallel/pipeline/send_release.h"

namespace gpt {

namespace {

struct StepIo {
  ParallelState& ps;
  const BatchLoader& loader;
  Backend& backend;
  int64_t consumed;
  bool needs_data;
  std::map<int, Microbatch> batches;
  // Posted sends by the index of the action that sent them; each keeps its buffer alive until released.
  std::map<int, std::unique_ptr<PendingSend>> sends;
  std::map<int, Tensor> send_buffers;

  const Microbatch& batch(int mb) {
    auto it = batches.find(mb);
    if (it != batches.end()) return it->second;
    Microbatch b;
    if (needs_data) {
      b = loader.load(backend, consumed, mb);
    } else {
      b.B = loader.micro_batch();
      b.T = loader.seq_length();
    }
    return batches.emplace(mb, std::move(b)).first->second;
  }
  Tensor recv(int peer, int tag, int64_t rows, int64_t hidden, DType dtype) {
    Tensor t = backend.empty({rows, hidden}, dtype);
    ps.pp->recv(t, peer, tag);
    return t;
  }
  void send(int action, const Tensor& t, int peer, int tag) {
    send_buffers.emplace(action, t);
    sends.emplace(action, ps.pp->send_async(t, peer, tag));
  }
  // At the send's release point (send_release.h): the peer has taken it, or (an activation sent
  // downstream) has posted or is about to post its receive; once the wait returns the buffer is freed.
  void release(int action) {
    auto it = sends.find(action);
    if (it == sends.end()) return;
    it->second->wait();
    sends.erase(it);
    send_buffers.erase(action);
  }
  void finish() {
    for (auto& [action, s] : sends) s->wait();
    sends.clear();
    send_buffers.clear();
  }
};

void run(ParallelState& ps, LayerContext& ctx, const std::vector<ModelChunk*>& chunks, const BatchLoader& loader,
         int64_t consumed, float grad_scale, bool training, Tensor& loss_sum, const ChunkGradsDone* grads_done) {
  const int p = ps.pp_size(), v = static_cast<int>(chunks.size());
  const int m = static_cast<int>(loader.microbatches_per_rank());
  const int stages = p * v;
  // Tokens are read on ranks holding the first or last virtual stage; others only need the shapes.
  bool needs_data = false;
  for (ModelChunk* c : chunks) needs_data = needs_data || c->is_first() || c->is_last();
  StepIo io{ps, loader, ctx.backend, consumed, needs_data, {}, {}, {}};
  const std::vector<PipelineAction> actions = step_table(p, v, m, ps.pp_rank(), !training).actions;
  // Each chunk's last backward pass of the step, and the callbacks that pass reports completed gradients to.
  std::vector<int> last_backward(v, -1);
  for (int k = 0; k < static_cast<int>(actions.size()); ++k)
    if (actions[k].kind == PassKind::Backward) last_backward[actions[k].chunk] = k;
  std::vector<ModelChunk::GradsDone> chunk_done(v);
  if (grads_done)
    for (int c = 0; c < v; ++c)
      chunk_done[c] = [grads_done, c](const std::vector<Parameter*>& params) { (*grads_done)(c, params); };
  const std::vector<int>& release_at = (*cached_send_release_points(p, v, m, !training))[ps.pp_rank()];
  std::vector<std::vector<int>> released_by(actions.size() + 1);  // action index -> sends released there
  for (size_t i = 0; i < release_at.size(); ++i)
    if (release_at[i] >= 0) released_by[release_at[i]].push_back(static_cast<int>(i));
  for (int k = 0; k < static_cast<int>(actions.size()); ++k) {
    const PipelineAction& a = actions[k];
    ModelChunk& chunk = *chunks[a.chunk];
    const Microbatch& b = io.batch(a.microbatch);
    const int64_t rows = rows_outside_tp_region(ctx, b.B * b.T);
    const int64_t hidden = chunk.hidden();
    Tensor input;
    if (a.recv)
      input = io.recv(a.recv->rank, transfer_tag(a.kind, a.virtual_stage, a.microbatch, stages), rows, hidden,
                      chunk.activation_dtype());
    for (int sent : released_by[k]) io.release(sent);
    Tensor output;
    if (a.kind == PassKind::Forward) {
      output = training ? chunk.forward(ctx, a.microbatch, b, input, grad_scale, &loss_sum)
                        : chunk.eval_forward(ctx, b, input, &loss_sum);
    } else {
      const bool report = grads_done && k == last_backward[a.chunk];
      output = chunk.backward(ctx, a.microbatch, b, input, report ? &chunk_done[a.chunk] : nullptr);
    }
    if (a.send) io.send(k, output, a.send->rank, transfer_tag(a.kind, a.send->virtual_stage, a.microbatch, stages));
    // A microbatch's inputs are no longer needed once its last pass on this rank is done.
    if ((a.kind == PassKind::Backward || !training) && a.chunk == (a.kind == PassKind::Backward ? 0 : v - 1))
      io.batches.erase(a.microbatch);
  }
  io.finish();
}

}  // namespace

void run_pipeline_step(ParallelState& ps, LayerContext& ctx, const std::vector<ModelChunk*>& chunks,
                       const BatchLoader& loader, int64_t consumed, float grad_scale, Tensor& loss_sum,
                       const ChunkGradsDone* grads_done) {
  run(ps, ctx, chunks, loader, consumed, grad_scale, true, loss_sum, grads_done);
}

double run_pipeline_eval(ParallelState& ps, LayerContext& ctx, const std::vector<ModelChunk*>& chunks,
                         const BatchLoader& loader, int64_t consumed) {
  Tensor loss_sum = ctx.backend.zeros({1}, DType::F64);
  run(ps, ctx, chunks, loader, consumed, 0.f, false, loss_sum, nullptr);
  double loss = 0;
  ctx.backend.download_f64(loss_sum, &loss);
  return loss;
}

}  // namespace gpt
