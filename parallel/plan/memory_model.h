// Memory model: the bytes one rank holds during a training step, predicted from the model (its shape and
// its variant: ModelDescription) and the parallel layout alone, for the start-up log, the planner's "does
// it fit" test and the check against the CPU backend's exact allocation counters. It mirrors what this
// codebase allocates for every variant the model has:
//  - weights: each model chunk's flat value buffer in the compute dtype (padded to a multiple of dp), from
//    model/param_count.h's exact counts: grouped-query qkv, GELU's two or SwiGLU's three MLP matrices,
//    LayerNorm's or RMSNorm's parameters, biases or none, the position table only with learned positions,
//    and on the last stage the untied output layer or the tied copy of the word embedding;
//  - grads: the flat gradient buffer of each chunk (fp32 here; LayoutSpec::grad_dtype), plus the LM head's
//    separate gradient of the tied embedding when one stage holds both ends (pipeline size 1, tied only);
//  - optimizer: AdamW m and v in fp32, plus fp32 master weights when the compute dtype is not fp32, over
//    this rank's shard of the buffers with the distributed optimizer (ZeRO-1) or all of them without;
//  - activations: the peak, over the pipeline schedule of this rank, of everything a step allocates on
//    top of that: per microbatch and layer the tensors BlockCache keeps (input, ln1, ln1_full, qkv
//    [N, (heads + 2 groups) head_dim / tp] after rotary encoding (in place), att, the attention statistics
//    [B, H/tp, T] fp32, h, ln2, ln2_full, fc1 [N, ffn/tp] or SwiGLU's [N, 2 ffn/tp], act [N, ffn/tp], the
//    norm statistics: mean and rstd for LayerNorm, rstd alone for RMSNorm) times the microbatches
//    in flight (num_warmup_passes + 1 chunk passes for 1F1B), the transients of the pass being run (the
//    LM head's logits [N, V/tp] fp32 (the gradient overwrites them, or with bf16 weights is a bf16 tensor of
//    its own, the logits freed right after it is written) on the last stage, the gradients of one block in
//    backward (dfc1 as wide as fc1), the layer rebuilt by recomputation), the token batches of the first
//    and last stage, and the pipeline send buffers, which the executor keeps until a received message
//    proves their delivery (a few per stage, not one per microbatch); or, if larger, the
//    optimizer step's transient (the distributed optimizer's reduce-scatter target; with 16-bit gradient
//    buffers, as Megatron-LM has them, their fp32 copies); plus the trainer's per-step sums (the loss and
//    the gradient square of each parameter tensor, F64: a few hundred bytes).
// Attention is fused: no [B, H, T, T] tensor exists (the backends' per-thread attention scratch is not a
// tensor and is not counted). Recomputation (model/transformer_block.h): selective drops the activation's
// output (GELU or SwiGLU, recomputed from fc1's output), full keeps only each block's input (and its h until the
// next norm has added it) and reruns the block before its backward.
// The event walk replays, pass by pass, the allocation order of model/transformer_block.cpp, model/norm.cpp,
// model/mlp_activation.cpp, model/gpt_model.cpp, model/lm_head.cpp and parallel/pipeline/pipeline_executor.cpp; a
// change there needs the same change here (tests/parallel/plan/memory_model_test.cpp compares the two on real runs, GPT
// and Llama-shaped models).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/model_description.h"
#include "model/tensor.h"
#include "model/transformer_block.h"
#include "parallel/pipeline/pipeline_schedule.h"
#include "parallel/plan/overlap.h"

namespace gpt {

struct Config;
class GridLayout;


// One way to run the model: the degrees of parallelism and the per-step settings that change memory or
// time. The number of microbatches per step is global_batch / (micro_batch * dp). cp: context
// parallelism (model/context_chunks.h), each rank holding seq_length / cp positions of every sequence;
// the gradients reduce, and the distributed optimizer shards, over dp * cp ranks.
struct LayoutSpec {
  int tp = 1, pp = 1, vpp = 1, dp = 1, cp = 1;
  int64_t micro_batch = 1, global_batch = 1;
  bool sequence_parallel = false;
  // parallel.tp_comm_overlap: the region's reduce-scatters run row block by row block (model/tp_overlap.h),
  // which holds more transient blocks. Memory only; whether the transfers hide is `overlaps.tp`.
  bool tp_comm_overlap = false;
  bool distributed_optimizer = false;
  Recompute recompute = Recompute::None;
  DType dtype = DType::F32;
  // The gradient buffers, their accumulation over microbatches and their data-parallel reduction: fp32
  // in this codebase; Megatron-LM keeps them in the compute dtype for fp16 unless
  // --accumulate-allreduce-grads-in-fp32 is given (then copies them to fp32 for the optimizer step).
  DType grad_dtype = DType::F32;
  // Megatron-LM's scatter/gather of pipeline sends (Narayanan et al. 2021, sec. 4.1): each tensor-parallel
  // rank sends 1/tp of the activation and the receivers all-gather it over the node's links. Time only:
  // this codebase sends the whole activation from every tensor-parallel rank.
  bool p2p_scatter_gather = false;
  // Megatron-LM's (2021) unfused attention: the [B, H, T, T] scores, softmax probabilities, dropout mask
  // and dropped probabilities cross memory in forward and again in backward, which does not recompute
  // QK^T. Time only: this codebase's attention is fused and has no dropout.
  bool materialized_attention = false;
  // Megatron's unfused vocab-parallel cross entropy (megatron/core/tensor_parallel/cross_entropy.py): the
  // logits are cast to fp32, then max, subtract, exp, sum and divide each pass over them, and the backward
  // scales the softmax and casts it back, 48 + 2d bytes per logit against the 20 of this codebase's fused
  // one. Time only.
  bool unfused_cross_entropy = false;
  // Megatron's sequence parallelism keeps only the local rows of a column-parallel linear's input and
  // all-gathers them again in backward for the weight gradient (megatron/core/tensor_parallel/layers.py,
  // LinearWithGradAccumulationAndAsyncCommunication), where this codebase keeps the gathered norm
  // outputs: two fewer [N, h] tensors per layer in the cache, two more all-gathers per layer in backward
  // (beside the input-gradient products of qkv and fc1). Memory and time.
  bool regather_sp_inputs = false;
  // Communication that runs beside compute (parallel/plan/overlap.h). Time only.
  Overlaps overlaps;
  // Asynchronous checkpoint saves (checkpoint.async_save with a checkpoint.dir): each rank holds a host
  // snapshot of what it saves (MemoryEstimate::checkpoint_host); with or without the Adam moments.
  bool checkpoint_snapshot = false;
  bool snapshot_optimizer_state = true;
  int64_t microbatches() const { return global_batch / (micro_batch * dp); }
  int world() const { return tp * cp * pp * dp; }
  int grad_group() const { return dp * cp; }  // the ranks that reduce each gradient
  // "tp=2 pp=2 vpp=1 dp=1 mb=4 recompute=none dist_opt=off"
  std::string str() const;
};

const char* recompute_name(Recompute r);

// How long the pipeline executor keeps a sent activation or gradient alive: until a message it receives
// proves the peer has it (this codebase's executor, parallel/pipeline/pipeline_executor.cpp, with the release
// points of parallel/pipeline/send_release.h), or only until it is delivered (an executor that waits for each
// transfer, as Megatron-LM's does).
enum class SendBuffers { ReleasedWhenKnownReceived, FreedOnDelivery };

// Predicted bytes of one rank (one pipeline stage; every tp and dp rank of a stage holds the same
// amount, except that dp rank 0 holds the largest optimizer shard).
struct MemoryEstimate {
  int pp_rank = 0;
  int64_t weights = 0, grads = 0, optimizer = 0;
  int64_t activations = 0;       // peak of everything else during a step (see above)
  int64_t activation_cache = 0;  // saved tensors of one microbatch through one chunk of this stage
  int64_t in_flight = 0;         // the most chunk passes whose saved tensors are held at once
  int64_t parameters = 0;        // parameters this rank holds (its shards, unpadded)
  // Host memory, not device memory: the snapshot of asynchronous checkpoint saves (parallel/
  // checkpoint_writer.h), 4 bytes per element this rank saves: values, fp32 master weights when the
  // compute dtype is not fp32, and the two Adam moments unless they are not saved; the word embedding's
  // tied copy on the last stage is not saved. 0 without LayoutSpec::checkpoint_snapshot.
  int64_t checkpoint_host = 0;
  int64_t static_bytes() const { return weights + grads + optimizer; }
  int64_t total() const { return static_bytes() + activations; }
};

// Throws std::invalid_argument naming the rule when the layout cannot run this model (the same rules the
// trainer enforces: divisibility of heads, query groups, hidden, ffn and layers, the batch split, the
// interleaved schedule's constraints).
void validate_layout(const ModelDescription& model, const LayoutSpec& layout);
// The prediction for pipeline rank `pp_rank`, and for the rank that holds the most.
MemoryEstimate estimate_memory(const ModelDescription& model, const LayoutSpec& layout, int pp_rank,
                               SendBuffers sends = SendBuffers::ReleasedWhenKnownReceived);
MemoryEstimate estimate_peak_memory(const ModelDescription& model, const LayoutSpec& layout,
                                    SendBuffers sends = SendBuffers::ReleasedWhenKnownReceived);
// The largest single tensor a forward pass allocates: the fp32 logits [N, V/tp] or the first MLP linear's
// output [N, fc1 width / tp] of one microbatch. A lower bound for evaluation, which keeps nothing
// for a backward pass.
int64_t largest_forward_tensor(const ModelDescription& model, const LayoutSpec& layout);

// Parameters held by pipeline rank `pp_rank`, per model chunk, counting this rank's tensor-parallel
// shards (replicated tensors in full) and the tied copy of the word embedding on the last stage.
std::vector<int64_t> chunk_parameter_counts(const ModelDescription& model, const LayoutSpec& layout, int pp_rank);

// The (kind, local chunk) order of pipeline rank `rank`'s passes: the same order as
// schedule(p, v, m, rank).actions, without building the table (the planner evaluates thousands of layouts).
std::vector<std::pair<PassKind, int>> schedule_passes(int p, int v, int m, int rank);


// "1.23 GiB", "45.60 MiB", "3.0 KiB".
std::string format_bytes(int64_t bytes);
// A few lines for the log: one per pipeline stage that differs (first, last), in GiB.
std::string format_memory_estimate(const ModelDescription& model, const LayoutSpec& layout);

}  // namespace gpt
