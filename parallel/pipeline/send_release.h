// When a pipeline rank frees an activation or gradient it has sent: a pure function of the schedule
// tables (parallel/pipeline/pipeline_schedule.h), shared by the executor (parallel/pipeline/pipeline_executor.cpp), which
// waits for each send at its release point and drops the buffer, and by the memory model
// (parallel/plan/memory_model.cpp), which replays the same releases; both agree to the byte, and neither
// depends on timing.
//
// Two rules. (1) A forward activation sent to the next rank (not the interleaved schedule's wrap from the
// last rank to the first) is waited for right after the receive of the sender's next action, as
// Megatron-LM's paired send-forward/receive-backward does; those waits point downstream only, and
// send_release_points runs the tables with them to prove they cannot deadlock (if a table did, rule 1 is
// dropped for it). (2) Every other send is released at the first action whose received message shows,
// through a chain of transfers (vector clocks), that the peer has taken it: a gradient when the previous
// rank's next activation arrives, a wrap activation when its gradient returns. Such a wait never blocks.
// In training a rank thus holds a bounded number of send buffers (at most about 2p, most of them
// gradients of the cool-down, when saved activations are being freed), not one per microbatch; in
// evaluation (forward-only tables) one, plus the wrap activations of an interleaved schedule.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/pipeline/pipeline_schedule.h"

namespace gpt {

// Release points, index = rank, then action index in that rank's table: for an action that sends, the
// index k > it of the action at whose start (after its receive, before its compute) the send is waited for
// and freed; k = the table's size means "at the end of the step". -1 for actions that send nothing. Throws
// std::invalid_argument when the tables do not run to completion (a transfer is never sent, or sent or
// received twice).
std::vector<std::vector<int>> send_release_points(int p, int v, const std::vector<PipelineSchedule>& tables);

// The table the executor runs for one step on `rank`: schedule(p, v, m, rank), with the backward passes
// removed when `forward_only` (evaluation); and all ranks' (index = rank).
PipelineSchedule step_table(int p, int v, int m, int rank, bool forward_only);
std::vector<PipelineSchedule> step_tables(int p, int v, int m, bool forward_only);

// send_release_points(p, v, step_tables(p, v, m, forward_only)), computed once per distinct argument set
// (the executor asks every step, the planner for many layouts sharing p, v and m). Thread-safe.
std::shared_ptr<const std::vector<std::vector<int>>> cached_send_release_points(int p, int v, int m,
                                                                               bool forward_only);

// The most send buffers one rank holds at once under its release points (a buffer counts from its send
// until its release action).
int max_live_send_buffers(const std::vector<int>& release_points);

}  // namespace gpt
