// Max-reduction of the FP8 amaxes over tp and dp x cp, then the scale update (fp8_amax_sync.h).
#include "parallel/data_parallel/fp8_amax_sync.h"

#include <cmath>
#include <limits>

namespace gpt {

void sync_fp8_amaxes_and_update_scales(ParallelState& ps, const std::vector<ModelChunk*>& chunks) {
  std::vector<double> amax;
  for (ModelChunk* c : chunks) {
    const std::vector<double> p = c->fp8_scales().pending();
    amax.insert(amax.end(), p.begin(), p.end());
  }
  // MPI's max of a NaN is unspecified: as +inf it reaches every rank alike (and, not finite, keeps the scale).
  for (double& a : amax)
    if (std::isnan(a)) a = std::numeric_limits<double>::infinity();
  if (amax.empty()) return;
  for (Communicator* group : {ps.tp.get(), ps.dp.get()})
    if (group && group->size() > 1) group->all_reduce_host(amax.data(), static_cast<int64_t>(amax.size()), ReduceOp::Max);
  size_t at = 0;
  for (ModelChunk* c : chunks) {
    const size_t n = c->fp8_scales().size();
    c->fp8_scales().update(std::vector<double>(amax.begin() + at, amax.begin() + at + n));
    at += n;
  }
}

}  // namespace gpt
