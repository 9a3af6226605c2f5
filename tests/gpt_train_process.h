// The gpt-train binary and python3 as child processes, for the tests that drive them (the checkpoint and
// convert tests). GPT_TRAIN_BINARY is the path of the binary, defined by tests/CMakeLists.txt.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

extern char** environ;

namespace gpt::ckpt_test {

// Runs gpt-train as a child process (stdout and stderr to `log`) without the MPI environment of this
// singleton test process, which would make the child join our job instead of starting its own.
inline pid_t spawn_gpt_train(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string v = *e;
    bool mpi = v.rfind("OMPI_", 0) == 0 || v.rfind("PMIX_", 0) == 0 || v.rfind("OPAL_", 0) == 0;
    if (!mpi || v.rfind("OMPI_ALLOW_RUN_AS_ROOT", 0) == 0) env.push_back(v);
  }
  std::vector<std::string> argv_s = {GPT_TRAIN_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  pid_t pid = fork();
  if (pid == 0) {
    std::FILE* out = std::fopen(log.c_str(), "w");
    if (out) {
      dup2(fileno(out), 1);
      dup2(fileno(out), 2);
    }
    std::vector<char*> argv, envp;
    for (auto& s : argv_s) argv.push_back(s.data());
    for (auto& s : env) envp.push_back(s.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

inline int run_gpt_train(const std::vector<std::string>& args, const std::string& log) {
  int status = 0;
  waitpid(spawn_gpt_train(args, log), &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

inline void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Runs /usr/bin/python3 `script` with `args`; its stdout and stderr, or "FAILED(rc): " and them.
inline std::string run_python(const std::string& script, const std::vector<std::string>& args) {
  std::string cmd = "/usr/bin/python3 " + script;
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (p && std::fgets(buf, sizeof buf, p)) out += buf;
  int rc = p ? pclose(p) : -1;
  return rc == 0 ? out : "FAILED(" + std::to_string(rc) + "): " + out;
}

}  // namespace gpt::ckpt_test
