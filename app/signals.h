// Graceful stop on SIGTERM / SIGUSR1. Clusters warn a job before they end it: Slurm sends SIGUSR1 ahead of
// the time limit (sbatch --signal) and SIGTERM on scancel or preemption, and mpirun forwards SIGUSR1 to
// every rank. The first such signal only sets a flag; the trainer agrees on it over the whole world after
// each step (any rank's flag stops every rank after the same step), saves a checkpoint and returns, and the
// process exits 0. A second signal means "now": the handler prints why and _exits at once with status
// 128 + signal, without a checkpoint. The same signal repeated within one second is not a second request
// but the launcher's echo of the first (srun forwards the SIGTERM that slurmstepd also delivers to each
// task on scancel) and is ignored. The handler itself does only async-signal-safe work (a flag, write,
// _exit); everything else happens on the training thread.
#pragma once
#include <string>

namespace gpt {

class Communicator;

// Installs the handlers for SIGTERM and SIGUSR1 in this process; `rank` names the process in the messages
// the handler writes to stderr. Calling it again updates the rank and clears any earlier request.
void install_stop_signal_handlers(int rank);
// Puts the default dispositions back (tests).
void restore_default_signal_handlers();

// The first stop signal this process received, or 0 when none has arrived.
int stop_signal_received();
// Sets the flag as a signal would (tests, and callers that want to stop for their own reasons).
void request_stop(int signo);
// Clears the flag (tests).
void clear_stop_request();

// Collective over `world`, the same on every rank, so all ranks leave the training loop after the same
// step: the largest signal number any rank received (0 when none did), and whether any rank found its run
// time past the limit (`time_up` on that rank; ranks' clocks differ slightly, so each decides alone).
struct StopAgreement {
  int signal = 0;
  bool time_up = false;
};
StopAgreement agree_on_stop(Communicator& world, bool time_up);

// "SIGTERM", "SIGUSR1", ... or "signal N".
std::string signal_name(int signo);

}  // namespace gpt
