// Tests for the command-line parser (app/cli.cpp): subcommand detection and the train default, --config,
// repeated --set, --name value / --name=value / flags, positional arguments, typed getters, option
// checking, and the errors and --help text.
#include <gtest/gtest.h>

#include "app/cli.h"

namespace gpt {
namespace {

ParsedArgs parse(const std::vector<std::string>& args) { return parse_args(args); }

void expect_cli_error(const std::vector<std::string>& args, const std::string& part) {
  try {
    parse(args);
  } catch (const CliError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    return;
  }
  ADD_FAILURE() << "no CliError for args mentioning " << part;
}

TEST(Cli, SubcommandDetection) {
  EXPECT_EQ(parse({}).command, "");
  EXPECT_EQ(parse({"--config", "a.yaml"}).command, "train");
  for (const char* name : {"train", "eval", "prep", "schedule", "config", "plan"})
    EXPECT_EQ(parse({name}).command, name);
  ParsedArgs help = parse({"--help"});
  EXPECT_TRUE(help.help);
  EXPECT_EQ(help.command, "");
  EXPECT_TRUE(parse({"help"}).help);
  ParsedArgs train_help = parse({"train", "-h"});
  EXPECT_TRUE(train_help.help);
  EXPECT_EQ(train_help.command, "train");
}

TEST(Cli, ConfigSetOptionsAndPositionals) {
  ParsedArgs a = parse({"train", "--config", "c.yaml", "--set", "model.num_layers=4", "--set=optimizer.lr=1e-3",
                        "--pp", "2", "--name=x=y", "--dump", "file1", "--seed", "-5", "--verbose", "--", "--raw"});
  EXPECT_EQ(a.command, "train");
  EXPECT_EQ(a.config, "c.yaml");
  EXPECT_EQ(a.sets, (std::vector<std::string>{"model.num_layers=4", "optimizer.lr=1e-3"}));
  EXPECT_EQ(a.get("pp"), "2");
  EXPECT_EQ(a.get_int("pp", 1), 2);
  EXPECT_EQ(a.get("name"), "x=y");
  EXPECT_TRUE(a.has("dump"));  // a switch: it does not swallow "file1"
  EXPECT_EQ(a.get("dump"), "");
  EXPECT_EQ(a.get_int("seed", 0), -5);  // a negative number is a value, not an option
  EXPECT_TRUE(a.get_bool("verbose", false));
  EXPECT_EQ(a.positional, (std::vector<std::string>{"file1", "--raw"}));
  EXPECT_FALSE(a.has("missing"));
  EXPECT_EQ(a.get("missing", "fallback"), "fallback");
  EXPECT_EQ(a.get_int("missing", 7), 7);
  EXPECT_DOUBLE_EQ(a.get_double("missing", 0.5), 0.5);
}

TEST(Cli, RepeatedOptionsAndTypedGetters) {
  ParsedArgs a = parse({"prep", "--input", "a.txt", "--input", "b.txt", "--ratio", "0.25", "--flag=false", "--n", "x"});
  EXPECT_EQ(a.get_all("input"), (std::vector<std::string>{"a.txt", "b.txt"}));
  EXPECT_EQ(a.get("input"), "b.txt");  // the last one wins for get()
  EXPECT_DOUBLE_EQ(a.get_double("ratio", 0), 0.25);
  EXPECT_FALSE(a.get_bool("flag", true));
  EXPECT_THROW(a.get_int("n", 0), CliError);
  EXPECT_THROW(a.get_double("n", 0), CliError);
  EXPECT_THROW(a.get_bool("n", false), CliError);
  EXPECT_THROW(a.get_int("ratio", 0), CliError);
  try {
    a.get_int("n", 0);
  } catch (const CliError& e) {
    EXPECT_NE(std::string(e.what()).find("--n expects an integer, got 'x'"), std::string::npos) << e.what();
  }
}

TEST(Cli, CheckOptions) {
  ParsedArgs a = parse({"eval", "--config", "c.yaml", "--set", "a.b=1", "--load", "ckpt"});
  EXPECT_NO_THROW(a.check_options({"load"}));
  try {
    a.check_options({"iters"});
    ADD_FAILURE() << "expected CliError";
  } catch (const CliError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown option --load for 'eval'"), std::string::npos) << e.what();
  }
}

TEST(Cli, Errors) {
  expect_cli_error({"trian"}, "unknown subcommand 'trian' (did you mean 'train'?)");
  expect_cli_error({"frobnicate"}, "known: train, eval, prep, schedule, config, plan");
  expect_cli_error({"configs/tiny-cpu.yaml"}, "gpt-train train --config configs/tiny-cpu.yaml");
  expect_cli_error({"train", "--config"}, "--config needs a file name");
  expect_cli_error({"train", "--config", "a", "--config", "b"}, "--config given twice");
  expect_cli_error({"train", "--set"}, "--set needs key.path=value");
  expect_cli_error({"train", "--set", "novalue"}, "--set 'novalue': expected key.path=value");
  expect_cli_error({"train", "-x"}, "unknown option '-x'");
  expect_cli_error({"train", "--set", "--config"}, "--set needs");
}

TEST(Cli, UsageListsEverySubcommand) {
  std::string text = usage_text();
  for (const Subcommand& s : subcommands()) {
    EXPECT_NE(text.find(std::string("  ") + s.name), std::string::npos) << s.name;
    EXPECT_NE(text.find(s.summary), std::string::npos) << s.name;
  }
  EXPECT_NE(text.find("--set key.path=value"), std::string::npos);
  EXPECT_NE(text.find("--config FILE"), std::string::npos);
  std::vector<std::string> names;
  for (const Subcommand& s : subcommands()) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"train", "eval", "prep", "schedule", "config", "plan", "convert"}));
}

TEST(Cli, ArgcArgvForm) {
  const char* argv[] = {"gpt-train", "schedule", "--pp", "4"};
  ParsedArgs a = parse_args(4, const_cast<char**>(argv));
  EXPECT_EQ(a.command, "schedule");
  EXPECT_EQ(a.get_int("pp", 0), 4);
}

}  // namespace
}  // namespace gpt
