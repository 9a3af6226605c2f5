// Pipeline-parallel schedules as pure tables: for each pipeline rank, the ordered list of forward and
// backward passes it runs in one training step and the point-to-point transfers each pass implies, plus
// the model-chunk layer layout, a discrete-time simulator that checks the tables complete and measures
// their bubble, and a printable form. Plain 1F1B (v = 1) and Megatron-LM's interleaved 1F1B (v > 1).
//
// Layout. With p stages and v chunks per stage there are p * v virtual stages; rank r holds local chunks
// c = 0..v-1 whose virtual stages are c * p + r, and the model's layers are laid out in virtual-stage
// order. The virtual stage after (r, c) lives on (r + 1, c), or on (0, c + 1) when r = p - 1.
//
// Communication assumption (what the executor must honour). Receives block; sends are posted
// non-blocking and buffered until the peer receives them (Communicator::send_async). Under that rule
// every table produced here runs to completion: simulate() checks it, and the tests check it for every
// valid p <= 8, v <= 4, m <= 32.
// Every transfer is identified by (kind, microbatch, receiving virtual stage), and between one pair of
// ranks in one direction the transfers of one kind are received in the order they were sent, so a
// per-(peer, kind) FIFO match also works. Blocking (rendezvous) sends are not enough: already plain 1F1B with
// p = 2, m = 2 would hang, rank 0 sending F1's activation while rank 1 sends B0's gradient.
// The executor does wait for each activation sent downstream, after the receive of its next pass; the
// release points of parallel/pipeline/send_release.h run the tables with those waits to prove they complete.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpt {

enum class PassKind { Forward, Backward };

// The other end of a transfer: its pipeline rank and local chunk index there.
struct PeerEndpoint {
  int rank = 0;
  int chunk = 0;
  int virtual_stage = 0;  // chunk * p + rank
  bool operator==(const PeerEndpoint&) const = default;
};

// One forward or backward pass of one microbatch through one local chunk.
//   Forward:  recv = activation from the previous virtual stage (absent on virtual stage 0),
//             send = activation to the next virtual stage (absent on the last virtual stage, where the
//             forward ends in the loss).
//   Backward: recv = gradient from the next virtual stage (absent on the last virtual stage, which
//             starts from the loss), send = gradient to the previous virtual stage (absent on stage 0).
// recv happens before the pass's compute, send after it.
struct PipelineAction {
  PassKind kind = PassKind::Forward;
  int microbatch = 0;
  int chunk = 0;          // local model-chunk index, 0..v-1
  int virtual_stage = 0;  // chunk * p + rank
  std::optional<PeerEndpoint> recv;
  std::optional<PeerEndpoint> send;
  bool operator==(const PipelineAction&) const = default;
};

// The whole step for one pipeline rank.
struct PipelineSchedule {
  int pipeline_size = 1;     // p
  int virtual_size = 1;      // v
  int num_microbatches = 1;  // m
  int rank = 0;
  int num_warmup = 0;        // forwards of the warmup phase, before the steady (F, B) pairs; Megatron's
                             // num_warmup_microbatches (when pairs follow, one more F precedes the first B)
  std::vector<PipelineAction> actions;  // 2 * m * v entries, in execution order
};

// Throws std::invalid_argument naming the broken rule unless p >= 1, v >= 1, m >= 1, and, for v > 1,
// p > 1 and m % p == 0 (Megatron's interleaved-schedule constraint).
void validate_schedule_args(int p, int v, int m);
// Throws std::invalid_argument unless num_layers >= 1, p >= 1, v >= 1 and num_layers % (p * v) == 0.
void validate_pipeline_layout(int num_layers, int p, int v);

// Megatron's warmup count for `rank`: min(p - rank - 1, m) when v = 1; min(2 (p - rank - 1) + (v - 1) p, m v)
// when v > 1 (Megatron-Core's rule; the older special case "m == p: everything is warmup" is not used).
int num_warmup_passes(int p, int v, int m, int rank);

// The schedule for one rank. v = 1: warmup forwards, then (F, B) pairs, then the remaining backwards.
// v > 1: the k-th forward runs microbatch (k / (p v)) p + k % p on chunk (k / p) % v, the k-th backward the
// same microbatch on chunk v - 1 - (k / p) % v; steady state pairs forward k + warmup with backward k.
// Throws std::invalid_argument on invalid arguments or rank outside [0, p).
PipelineSchedule schedule(int p, int v, int m, int rank);
// All ranks' schedules, index = rank.
std::vector<PipelineSchedule> schedule_all_ranks(int p, int v, int m);

// The message tag of a transfer, unique within a step: (microbatch, receiving virtual stage, kind), so
// matching never depends on message order. In [0, 2 m p v).
int transfer_tag(PassKind kind, int receiving_stage, int microbatch, int total_stages);

// Neighbours in virtual-stage order; nullopt past either end.
std::optional<PeerEndpoint> next_virtual_stage(int p, int v, int rank, int chunk);
std::optional<PeerEndpoint> previous_virtual_stage(int p, int v, int rank, int chunk);

// Global layer indices [first, last) held by (rank, chunk): virtual stage s = chunk * p + rank holds
// layers [s L / (p v), (s + 1) L / (p v)). Validates the layout and the (rank, chunk) indices.
std::pair<int, int> chunk_layer_range(int num_layers, int p, int v, int rank, int chunk);

// Cost model of the simulator, in abstract time units per pass of one chunk. The default tb = 2 tf is the
// assumption behind Megatron's bubble formula; transfers take no time.
struct SimCost {
  int64_t forward = 1;
  int64_t backward = 2;
};

struct SimResult {
  bool completed = false;  // false: deadlock (or a table waits for a pass no rank runs); see `error`
  std::string error;
  int64_t makespan = 0;          // time at which the last pass finishes
  std::vector<int64_t> busy;     // per rank: total compute time
  std::vector<int64_t> idle;     // per rank: makespan - busy
  std::vector<int64_t> finish;   // per rank: time its last pass finishes
  // idle / busy for one rank: the pipeline bubble relative to the ideal (bubble-free) compute time.
  double bubble_fraction(int rank) const;
};

// Runs the given tables (index = rank) together in discrete time: each rank executes its actions in order,
// one at a time, each as early as its data dependency allows (forward of virtual stage s needs the forward
// of s - 1 for the same microbatch, backward of s needs the backward of s + 1, or the forward of s on the
// last virtual stage). Never loops: if no rank can progress before all are done, returns completed = false
// with an error naming each blocked rank. Throws std::invalid_argument if the tables are malformed (wrong
// count, rank, chunk, microbatch or virtual-stage fields inconsistent with p, v and m, a pass listed twice)
// or a cost is negative.
SimResult simulate_tables(int p, int v, const std::vector<PipelineSchedule>& tables, SimCost cost = {});
// simulate_tables over schedule_all_ranks(p, v, m). For every valid combination tried in the tests the
// result is exact: each rank's idle time is (p - 1) (tf + tb) with the cost model's tf, tb, so
// idle / busy = (p - 1) / (v m).
SimResult simulate(int p, int v, int m, SimCost cost = {});

// Human-readable table: one line per rank, "rank R: F0.0 F1.0 ... B0.0" (pass, microbatch.chunk), followed
// by each rank's warmup count and the bubble, theory (p - 1) / (v m) next to the simulated value.
std::string format_action(const PipelineAction& a);
std::string format_schedule(int p, int v, int m);

}  // namespace gpt
