// Text over a communicator (see host_messages.h): strings travel as zero-padded 32-bit words, their
// lengths through a host reduction.
#include "parallel/comm/host_messages.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace gpt {

namespace {

Tensor host_words(size_t bytes) {
  const int64_t words = std::max<int64_t>(1, static_cast<int64_t>((bytes + 3) / 4));
  auto storage = std::make_shared<Storage>();
  storage->ptr = ::operator new(static_cast<size_t>(words) * 4);
  std::memset(storage->ptr, 0, static_cast<size_t>(words) * 4);
  storage->bytes = static_cast<size_t>(words) * 4;
  storage->device = Device::CPU;
  storage->deleter = [](void* p, size_t) { ::operator delete(p); };
  return Tensor(storage, 0, {words}, DType::I32);
}

}  // namespace

std::string rank_prefix(const Communicator& comm) {
  return comm.size() > 1 ? "rank " + std::to_string(comm.rank()) + ": " : std::string();
}

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& s) {
  const int n = comm.size();
  std::vector<double> lengths(n, 0.0);
  lengths[comm.rank()] = static_cast<double>(s.size());
  comm.all_reduce_host(lengths.data(), n);
  size_t longest = 0;
  for (double l : lengths) longest = std::max(longest, static_cast<size_t>(l));
  Tensor in = host_words(longest);
  std::memcpy(in.raw(), s.data(), s.size());
  Tensor out = host_words(static_cast<size_t>(in.numel()) * 4 * n);
  comm.all_gather(in, out);
  std::vector<std::string> all(n);
  for (int r = 0; r < n; ++r)
    all[r].assign(static_cast<const char*>(out.raw()) + size_t(r) * in.numel() * 4, static_cast<size_t>(lengths[r]));
  return all;
}

std::string broadcast_string(Communicator& comm, const std::string& s, int root) {
  double length = comm.rank() == root ? static_cast<double>(s.size()) : 0.0;
  comm.all_reduce_host(&length, 1);
  Tensor t = host_words(static_cast<size_t>(length));
  if (comm.rank() == root) std::memcpy(t.raw(), s.data(), s.size());
  comm.broadcast(t, root);
  return std::string(static_cast<const char*>(t.raw()), static_cast<size_t>(length));
}

std::string first_error(Communicator& comm, const std::string& error) {
  // A flag first: the common case (no error anywhere) moves one number, not every rank's text.
  double failed = error.empty() ? 0.0 : 1.0;
  comm.all_reduce_host(&failed, 1, ReduceOp::Max);
  if (failed == 0.0) return "";
  for (const std::string& e : all_gather_strings(comm, error))
    if (!e.empty()) return e;
  return "";
}

}  // namespace gpt
