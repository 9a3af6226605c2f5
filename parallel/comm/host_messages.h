// Text over a communicator: the small host-side messages that keep every rank's decisions alike (an
// error that one rank found, the checkpoint index rank 0 read, each rank's effective config). Built on
// all_reduce_host, all_gather and broadcast, so they work on MPI, NCCL's host side and a group of one.
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

#include "model/communicator.h"

namespace gpt {

// Every rank's string, in rank order (collective).
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& s);
// Rank `root`'s string on every rank (collective).
std::string broadcast_string(Communicator& comm, const std::string& s, int root);
// Every rank passes its own error ("" when fine); returns the lowest failing rank's message, or "" on
// every rank alike (collective).
std::string first_error(Communicator& comm, const std::string& error);
// "rank R: " in a group of more than one, "" alone: the prefix of a message that one rank raises.
std::string rank_prefix(const Communicator& comm);
// first_error, thrown as `E` on every rank when any rank failed.
template <class E>
void agree_or_throw(Communicator& comm, const std::string& error) {
  const std::string e = first_error(comm, error);
  if (!e.empty()) throw E(e);
}

}  // namespace gpt
