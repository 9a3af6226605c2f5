// Tests for the metrics file (app/metrics.cpp) and the log line / logger set-up (app/logging.cpp). The
// JSON lines are parsed back by Python's json module, an independent parser, and checked value by value.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "app/logging.h"
#include "app/metrics.h"

namespace gpt {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

std::filesystem::path fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("gpt_metrics_test_" + std::to_string(getpid())) / name;
  std::filesystem::remove_all(dir);
  return dir;
}

std::vector<std::string> read_lines(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Parses every line of `path` with Python's json module and returns, per line, key -> repr(value)
// (strings as the hex of their UTF-8 bytes, so any character survives the trip back).
std::vector<std::map<std::string, std::string>> parse_with_python(const std::filesystem::path& path) {
  const std::string script =
      "import json, sys\n"
      "for line in open(sys.argv[1], encoding='utf-8'):\n"
      "    obj = json.loads(line)\n"
      "    assert isinstance(obj, dict)\n"
      "    print('\\t'.join(k + '=' + (v.encode('utf-8').hex() if isinstance(v, str) else repr(v))\n"
      "                    for k, v in obj.items()))\n";
  auto script_path = path.parent_path() / "parse.py";
  std::ofstream(script_path) << script;
  std::string command = std::string(kPython) + " " + script_path.string() + " " + path.string();
  std::FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (pipe && std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
  int status = pipe ? pclose(pipe) : -1;
  EXPECT_EQ(status, 0) << "python could not parse " << path << ":\n" << output;
  std::vector<std::map<std::string, std::string>> objects;
  size_t start = 0;
  while (start < output.size()) {
    size_t end = output.find('\n', start);
    std::string line = output.substr(start, end - start);
    start = end == std::string::npos ? output.size() : end + 1;
    std::map<std::string, std::string> fields;
    size_t pos = 0;
    while (pos <= line.size()) {
      size_t tab = line.find('\t', pos);
      std::string field = line.substr(pos, tab == std::string::npos ? std::string::npos : tab - pos);
      size_t eq = field.find('=');
      fields[field.substr(0, eq)] = field.substr(eq + 1);
      if (tab == std::string::npos) break;
      pos = tab + 1;
    }
    objects.push_back(fields);
  }
  return objects;
}

std::string hex(const std::string& text) {
  std::string out;
  for (unsigned char ch : text) {
    char b[3];
    std::snprintf(b, sizeof b, "%02x", ch);
    out += b;
  }
  return out;
}

IterationStats example_stats() {
  IterationStats s;
  s.iteration = 10;
  s.train_iters = 100;
  s.consumed_samples = 80;
  s.ms_per_iter = 123.4;
  s.lr = 6e-4;
  s.global_batch = 8;
  s.loss = 5.4321;
  s.loss_scale = 1.0;
  s.grad_norm = 1.234;
  s.tokens_per_s = 12345;
  s.tflops_per_device = 0.12;
  s.mem_in_use_bytes = static_cast<int64_t>(12.3 * 1024 * 1024);
  s.mem_peak_bytes = static_cast<int64_t>(45.6 * 1024 * 1024);
  return s;
}

bool have_python() { return access(kPython, X_OK) == 0; }

TEST(MetricsWriter, IterationAndEvalLinesParseBackExactly) {
  if (!have_python()) GTEST_SKIP() << kPython << " not available";
  auto dir = fresh_dir("lines");
  auto path = dir / "nested" / "deeper" / "metrics.jsonl";
  const float loss32 = 5.43210029602050781f;  // a float32 loss: %.9g must round-trip it bit for bit
  {
    MetricsWriter writer(path.string());
    ASSERT_TRUE(writer.enabled());
    IterationStats s = example_stats();
    s.loss = loss32;
    s.mfu = 0.25;
    writer.write_iteration(s);
    // Each line is on disk as soon as it is written (flushed), before the writer closes.
    EXPECT_EQ(read_lines(path).size(), 1u);
    writer.write_eval(100, "valid", 4.5, std::exp(4.5));
    IterationStats diverged = example_stats();
    diverged.iteration = 11;
    diverged.loss = NAN;
    diverged.grad_norm = INFINITY;
    writer.write_iteration(diverged);
    writer.write_eval(11, "we\"ird\\ split\n\t\x01 ünï", 1.0, 2.0);
  }
  auto objects = parse_with_python(path);
  ASSERT_EQ(objects.size(), 4u);

  auto& train = objects[0];
  EXPECT_EQ(train["event"], hex("train"));
  EXPECT_EQ(train["iteration"], "10");
  EXPECT_EQ(train["train_iters"], "100");
  EXPECT_EQ(train["consumed_samples"], "80");
  EXPECT_EQ(static_cast<float>(std::stod(train["loss"])), loss32);
  EXPECT_DOUBLE_EQ(std::stod(train["lr"]), 6e-4);
  EXPECT_DOUBLE_EQ(std::stod(train["grad_norm"]), 1.234);
  EXPECT_DOUBLE_EQ(std::stod(train["tokens_per_s"]), 12345);
  EXPECT_DOUBLE_EQ(std::stod(train["ms_per_iter"]), 123.4);
  EXPECT_DOUBLE_EQ(std::stod(train["loss_scale"]), 1.0);
  EXPECT_DOUBLE_EQ(std::stod(train["tflops_per_device"]), 0.12);
  EXPECT_DOUBLE_EQ(std::stod(train["mfu"]), 0.25);
  EXPECT_EQ(train["global_batch_size"], "8");
  EXPECT_EQ(train["skipped_iters"], "0");
  EXPECT_EQ(train["mem_in_use_bytes"], std::to_string(example_stats().mem_in_use_bytes));
  EXPECT_EQ(train["mem_peak_bytes"], std::to_string(example_stats().mem_peak_bytes));

  auto& eval = objects[1];
  EXPECT_EQ(eval["event"], hex("eval"));
  EXPECT_EQ(eval["iteration"], "100");
  EXPECT_EQ(eval["split"], hex("valid"));
  EXPECT_DOUBLE_EQ(std::stod(eval["loss"]), 4.5);
  EXPECT_NEAR(std::stod(eval["perplexity"]), std::exp(4.5), 1e-6);

  EXPECT_EQ(objects[2]["loss"], "None");  // NaN is written as null
  EXPECT_EQ(objects[2]["grad_norm"], "None");
  EXPECT_EQ(objects[2].count("mfu"), 0u);  // absent when not reported
  EXPECT_EQ(objects[3]["split"], hex("we\"ird\\ split\n\t\x01 ünï"));
  std::filesystem::remove_all(dir.parent_path());  // the per-process root
}

TEST(MetricsWriter, AppendsAcrossWritersAndDisabledWritesNothing) {
  auto dir = fresh_dir("append");
  auto path = dir / "m.jsonl";
  MetricsWriter(path.string()).write_eval(1, "valid", 2.0, 7.0);
  MetricsWriter(path.string()).write_eval(2, "valid", 1.0, 2.7);
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], R"({"event":"eval","iteration":1,"split":"valid","loss":2.0,"perplexity":7.0})");
  EXPECT_EQ(lines[1], R"({"event":"eval","iteration":2,"split":"valid","loss":1.0,"perplexity":2.7})");

  MetricsWriter disabled("");
  EXPECT_FALSE(disabled.enabled());
  disabled.write_iteration(example_stats());
  disabled.write_eval(1, "valid", 1, 1);
  std::filesystem::remove_all(dir.parent_path());  // the per-process root
}

TEST(MetricsWriter, UnopenablePathThrowsNamingIt) {
  auto dir = fresh_dir("blocked");
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "a_file") << "x";
  std::string path = (dir / "a_file" / "m.jsonl").string();
  try {
    MetricsWriter writer(path);
    ADD_FAILURE() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir.parent_path());
}

// Strings are escaped as JSON requires, and bytes that are not UTF-8 become U+FFFD instead of an error.
TEST(MetricsWriter, EscapesStringsAndReplacesBadBytes) {
  auto dir = fresh_dir("escapes");
  auto path = dir / "m.jsonl";
  MetricsWriter(path.string()).write_eval(1, "a\"b\\c\n\x01\x7f \xC3\xBC \xff", 1.0, 2.0);
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  const std::string want = R"("split":"a\"b\\c\n\u0001)" "\x7f \xC3\xBC \xEF\xBF\xBD\"";
  EXPECT_NE(lines[0].find(want), std::string::npos) << lines[0];
  std::filesystem::remove_all(dir.parent_path());
}

TEST(LogColour, OnlyOnATerminalOutsideLaunchersWithoutNoColor) {
  EXPECT_TRUE(log_colour_wanted(true, nullptr, "xterm-256color", false));
  EXPECT_TRUE(log_colour_wanted(true, "", nullptr, false));  // NO_COLOR set but empty does not count
  EXPECT_FALSE(log_colour_wanted(false, nullptr, "xterm", false));  // a file or a pipe
  EXPECT_FALSE(log_colour_wanted(true, "1", "xterm", false));
  EXPECT_FALSE(log_colour_wanted(true, nullptr, "dumb", false));
  EXPECT_FALSE(log_colour_wanted(true, nullptr, "xterm", true));  // a rank under mpirun or srun
}

TEST(IterationLine, MatchesMegatronStyle) {
  EXPECT_EQ(format_iteration_line(example_stats()),
            " iteration       10/     100 | consumed samples: 80 | elapsed time per iteration (ms): 123.4 |"
            " learning rate: 6.000E-04 | global batch size: 8 | lm loss: 5.432100E+00 | loss scale: 1.0 |"
            " grad norm: 1.234 | tokens/s: 12345 | TFLOP/s/device: 0.12 | mem (MiB): 12.3 in use, 45.6 peak |");
}

TEST(IterationLine, OptionalFieldsAndWideValues) {
  IterationStats s = example_stats();
  s.iteration = 123456789;
  s.train_iters = 200000000;
  s.mfu = 0.4123;
  s.skipped_iters = 2;
  s.loss_scale = 65536;
  s.tflops_per_device = 312.54;
  s.mem_in_use_bytes = -1;
  s.mem_peak_bytes = -1;
  std::string line = format_iteration_line(s);
  EXPECT_EQ(line.rfind(" iteration 123456789/200000000 |", 0), 0u) << line;
  EXPECT_NE(line.find("| loss scale: 65536.0 |"), std::string::npos) << line;
  EXPECT_NE(line.find("| TFLOP/s/device: 313 |"), std::string::npos) << line;
  EXPECT_NE(line.find("| MFU: 41.2% |"), std::string::npos) << line;
  EXPECT_NE(line.find("| skipped iterations: 2 |"), std::string::npos) << line;
  EXPECT_EQ(line.find("mem (MiB)"), std::string::npos) << line;
  s.tflops_per_device = 0.000123;
  EXPECT_NE(format_iteration_line(s).find("| TFLOP/s/device: 0.000123 |"), std::string::npos);
  s.tflops_per_device = 12.346;
  EXPECT_NE(format_iteration_line(s).find("| TFLOP/s/device: 12.35 |"), std::string::npos);
}

TEST(Logging, LevelsPerRankAndRankInPattern) {
  init_logging(0, "debug", false, false);
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::debug);
  init_logging(3, "info", false, false);
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::warn);
  init_logging(3, "error", false, false);
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::err);
  init_logging(3, "info", true, false);
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::info);
  EXPECT_THROW(init_logging(0, "loud", false, false), std::runtime_error);

  testing::internal::CaptureStdout();
  init_logging(2, "info", true, false);
  spdlog::info("hello {}", 42);
  init_logging(2, "info", false, false);
  spdlog::info("hidden on rank 2");
  spdlog::warn("shown on rank 2");
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("[rank 2]"), std::string::npos) << out;
  EXPECT_NE(out.find("hello 42"), std::string::npos) << out;
  EXPECT_EQ(out.find("hidden on rank 2"), std::string::npos) << out;
  EXPECT_NE(out.find("shown on rank 2"), std::string::npos) << out;
  init_logging(0, "info", false, false);
}

}  // namespace
}  // namespace gpt
