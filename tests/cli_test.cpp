// Tests for the command line (app/cli.cpp, app/cli_subcommands.cpp): subcommand detection and the train
// default, each subcommand's own --help, --config and ordered --set, values read into the typed options
// structs (--name value and --name=value), unknown options named with their subcommand, bad values, the
// rules between options, and the overview.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "app/cli.h"
#include "app/commands.h"
#include "app/convert.h"
#include "app/generate.h"
#include "app/plan.h"
#include "data/prep_pipeline.h"

namespace gpt {
namespace {

CommandLine parse(const std::vector<std::string>& args) { return parse_command_line(args); }

// The options struct the words parse into (a copy: the CommandLine does not outlive the call).
template <class Options>
Options options(const std::vector<std::string>& args) {
  return parse(args).get<Options>();
}

void expect_cli_error(const std::vector<std::string>& args, const std::string& part) {
  try {
    parse(args);
  } catch (const CliError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    return;
  }
  std::string words;
  for (const std::string& a : args) words += " " + a;
  ADD_FAILURE() << "no CliError for" << words << " (expected one mentioning " << part << ")";
}

// The flags each subcommand takes; its --help must list exactly its own.
const std::map<std::string, std::vector<std::string>>& flags_of() {
  static const std::map<std::string, std::vector<std::string>> flags = {
      {"train", {"--config", "--set", "--load"}},
      {"eval", {"--config", "--set", "--load", "--iters", "--random-init"}},
      {"prep",
       {"--input", "--from-megatron", "--output-prefix", "--tokenizer", "--vocab-file", "--merges-file", "--vocab-size",
        "--shard-tokens", "--shard-mb", "--workers", "--doc-separator", "--json-key"}},
      {"schedule", {"--pp", "--vpp", "--microbatches"}},
      {"config", {"--config", "--set", "--dump"}},
      {"plan",
       {"--config", "--set", "--gpus", "--gpus-per-node", "--hardware", "--json", "--top", "--recompute",
        "--distributed-optimizer", "--p2p-buffers", "--grad-dtype", "--p2p-scatter-gather", "--attention", "--probe",
        "--threads"}},
      {"convert", {"--from", "--to", "--config", "--set"}},
      {"generate",
       {"--load", "--config", "--set", "--prompt", "--prompt-file", "--max-new-tokens", "--temperature", "--top-k",
        "--top-p", "--seed", "--num-samples", "--backend", "--tokenizer", "--vocab-file", "--merges-file"}},
  };
  return flags;
}

TEST(Cli, SubcommandDetectionAndTheTrainDefault) {
  CommandLine none = parse({});
  EXPECT_EQ(none.command, "");
  EXPECT_FALSE(none.help);
  EXPECT_NE(none.help_text.find("usage: gpt-train"), std::string::npos);
  CommandLine by_default = parse({"--config", "a.yaml", "--set", "training.train_iters=3"});
  EXPECT_EQ(by_default.command, "train");
  EXPECT_TRUE(by_default.under_mpi);
  EXPECT_EQ(by_default.get<TrainOptions>().config, "a.yaml");
  EXPECT_EQ(by_default.get<TrainOptions>().sets, (std::vector<std::string>{"training.train_iters=3"}));
  EXPECT_EQ(parse({"--set=a.b=1"}).command, "train");
  EXPECT_TRUE(parse({"eval", "--load", "ckpt"}).under_mpi);
  EXPECT_TRUE(parse({"generate", "--load", "ckpt"}).under_mpi);
  EXPECT_FALSE(parse({"schedule"}).under_mpi);
  CommandLine help = parse({"--help"});
  EXPECT_TRUE(help.help);
  EXPECT_EQ(help.command, "");
  EXPECT_TRUE(parse({"-h"}).help);
  EXPECT_TRUE(parse({"help"}).help);
  CommandLine train_help = parse({"train", "-h"});
  EXPECT_TRUE(train_help.help);
  EXPECT_EQ(train_help.command, "train");
  CommandLine help_prep = parse({"help", "prep"});
  EXPECT_TRUE(help_prep.help);
  EXPECT_EQ(help_prep.command, "prep");
  EXPECT_NE(help_prep.help_text.find("--output-prefix"), std::string::npos) << help_prep.help_text;
}

TEST(Cli, EverySubcommandHasItsOwnHelp) {
  ASSERT_EQ(flags_of().size(), subcommands().size());
  std::vector<std::string> every_flag;
  for (const auto& [name, flags] : flags_of()) every_flag.insert(every_flag.end(), flags.begin(), flags.end());
  for (const Subcommand& s : subcommands()) {
    SCOPED_TRACE(s.name);
    ASSERT_TRUE(flags_of().count(s.name));
    for (const std::vector<std::string>& words : {std::vector<std::string>{s.name, "--help"},
                                                  std::vector<std::string>{s.name, "-h"}}) {
      CommandLine c = parse(words);
      EXPECT_TRUE(c.help);
      EXPECT_EQ(c.command, s.name);
      const std::string& text = c.help_text;
      EXPECT_NE(text.find("usage: gpt-train " + s.name + " [options]"), std::string::npos) << text;
      EXPECT_NE(text.find(s.summary), std::string::npos) << text;
      const std::vector<std::string>& own = flags_of().at(s.name);
      for (const std::string& flag : own)
        EXPECT_NE(text.find("  " + flag + " "), std::string::npos) << flag << "\n" << text;
      for (const std::string& flag : every_flag) {
        if (std::find(own.begin(), own.end(), flag) != own.end()) continue;
        EXPECT_EQ(text.find("  " + flag + " "), std::string::npos) << flag << " in\n" << text;
      }
    }
  }
  // Help wins over missing required options and is asked for anywhere on the line.
  EXPECT_TRUE(parse({"prep", "--workers", "2", "--help"}).help);
  EXPECT_TRUE(parse({"--config", "c.yaml", "--help"}).help);
  EXPECT_EQ(parse({"--config", "c.yaml", "--help"}).command, "train");
}

TEST(Cli, ConfigAndSetsInOrder) {
  CommandLine c = parse({"train", "--config", "c.yaml", "--set", "model.num_layers=4", "--set=optimizer.lr=1e-3",
                         "--load=ckpt", "--set", "data.train=[a,b]", "--set", "logging.metrics_file="});
  const auto& o = c.get<TrainOptions>();
  EXPECT_EQ(o.config, "c.yaml");
  EXPECT_EQ(o.load, "ckpt");
  EXPECT_EQ(o.sets, (std::vector<std::string>{"model.num_layers=4", "optimizer.lr=1e-3", "data.train=[a,b]",
                                              "logging.metrics_file="}));
  for (const char* name : {"eval", "config", "plan", "convert", "generate"}) {
    SCOPED_TRACE(name);
    std::vector<std::string> words = {name, "--set", "b.c=2", "--config=x.yaml", "--set", "a.b=1"};
    if (name == std::string("plan")) words.insert(words.end(), {"--gpus", "8"});
    if (name == std::string("convert")) words.insert(words.end(), {"--from", "m.safetensors", "--to", "dir"});
    CommandLine d = parse(words);
    std::vector<std::string> sets = name == std::string("eval")     ? d.get<EvalOptions>().sets
                                    : name == std::string("config") ? d.get<ConfigCommandOptions>().sets
                                    : name == std::string("plan")   ? d.get<PlanCommandOptions>().sets
                                    : name == std::string("convert") ? d.get<ConvertOptions>().sets
                                                                     : d.get<GenerateOptions>().sets;
    EXPECT_EQ(sets, (std::vector<std::string>{"b.c=2", "a.b=1"}));
  }
}

TEST(Cli, ValuesReachTheTypedOptions) {
  const auto eval = options<EvalOptions>({"eval", "--load", "ckpt", "--iters=0"});
  EXPECT_EQ(eval.load, "ckpt");
  ASSERT_TRUE(eval.iters.has_value());
  EXPECT_EQ(*eval.iters, 0);
  EXPECT_FALSE(eval.random_init);
  EXPECT_FALSE(options<EvalOptions>({"eval", "--load", "ckpt"}).iters.has_value());
  EXPECT_TRUE(options<EvalOptions>({"eval", "--config", "c.yaml", "--random-init"}).random_init);
  EXPECT_FALSE(options<EvalOptions>({"eval", "--config", "c.yaml", "--random-init=false"}).random_init);

  const auto s = options<ScheduleOptions>({"schedule", "--pp", "4", "--vpp=2", "--microbatches", "8"});
  EXPECT_EQ(s.pp, 4);
  EXPECT_EQ(s.vpp, 2);
  EXPECT_EQ(s.microbatches, 8);
  EXPECT_EQ(options<ScheduleOptions>({"schedule"}).pp, 1);

  // --input takes every word up to the next option, and repeats; an empty value is a value.
  CommandLine p = parse({"prep", "--input", "a.txt", "b.jsonl", "--output-prefix", "out/p", "--input=c", "d",
                         "--doc-separator", "", "--shard-mb", "0.5", "--workers=3", "--tokenizer", "gpt2",
                         "--vocab-file", "v.json", "--merges-file", "m.txt", "--json-key", "body", "--vocab-size",
                         "100", "--shard-tokens", "5000"});
  const auto& prep = p.get<PrepOptions>();
  EXPECT_EQ(prep.inputs, (std::vector<std::string>{"a.txt", "b.jsonl", "c", "d"}));
  EXPECT_EQ(prep.output_prefix, "out/p");
  ASSERT_TRUE(prep.doc_separator.has_value());
  EXPECT_EQ(*prep.doc_separator, "");
  EXPECT_DOUBLE_EQ(prep.shard_mb, 0.5);
  EXPECT_EQ(prep.workers, 3);
  EXPECT_EQ(prep.tokenizer, "gpt2");
  EXPECT_EQ(prep.vocab_file, "v.json");
  EXPECT_EQ(prep.merges_file, "m.txt");
  EXPECT_EQ(prep.json_key, "body");
  EXPECT_EQ(prep.vocab_size, 100);
  EXPECT_EQ(prep.shard_tokens, 5000);
  const auto plain = options<PrepOptions>({"prep", "--input", "a", "--output-prefix", "p"});
  EXPECT_FALSE(plain.doc_separator.has_value());
  EXPECT_EQ(plain.tokenizer, "bytes");
  EXPECT_EQ(plain.json_key, "text");
  // A word equal to a subcommand name is a value.
  EXPECT_EQ(options<PrepOptions>({"prep", "--input", "train", "eval", "--output-prefix", "plan"}).inputs,
            (std::vector<std::string>{"train", "eval"}));

  const auto plan = options<PlanCommandOptions>(
      {"plan", "--config", "c.yaml", "--gpus", "16", "--json", "--recompute", "none", "--distributed-optimizer=on",
       "--p2p-buffers", "freed", "--grad-dtype", "compute", "--p2p-scatter-gather", "on", "--attention",
       "materialized", "--top", "5", "--gpus-per-node", "4", "--hardware", "a100-80g"});
  EXPECT_EQ(plan.gpus, 16);
  EXPECT_EQ(plan.gpus_per_node, 4);
  EXPECT_TRUE(plan.json);
  EXPECT_EQ(plan.recompute, "none");
  EXPECT_EQ(plan.distributed_optimizer, "on");
  EXPECT_EQ(plan.p2p_buffers, "freed");
  EXPECT_EQ(plan.grad_dtype, "compute");
  EXPECT_EQ(plan.p2p_scatter_gather, "on");
  EXPECT_EQ(plan.attention, "materialized");
  EXPECT_EQ(plan.top, 5);
  EXPECT_EQ(plan.hardware, "a100-80g");
  const auto probe = options<PlanCommandOptions>({"plan", "--probe", "hw.yaml", "--threads", "2"});
  EXPECT_EQ(probe.probe, "hw.yaml");
  EXPECT_EQ(probe.threads, 2);

  const auto convert = options<ConvertOptions>({"convert", "--from", "ckpt", "--to", "m.safetensors"});
  EXPECT_EQ(convert.from, "ckpt");
  EXPECT_EQ(convert.to, "m.safetensors");
  // A Hugging Face Llama directory on either side needs no --config: config.json holds the model.
  const auto llama = options<ConvertOptions>({"convert", "--from", "hf_dir", "--to", "ckpt"});
  EXPECT_EQ(llama.from, "hf_dir");
  EXPECT_TRUE(llama.config.empty());
  EXPECT_TRUE(options<ConfigCommandOptions>({"config", "--dump"}).dump);
  EXPECT_EQ(options<PrepOptions>({"prep", "--from-megatron", "m/web", "--output-prefix", "p"}).from_megatron, "m/web");

  const auto gen = options<GenerateOptions>({"generate", "--load", "ckpt", "--prompt", "", "--max-new-tokens", "5",
                                             "--temperature=0", "--top-k", "40", "--top-p", "0.9", "--seed",
                                             "18446744073709551615", "--num-samples", "3", "--backend", "cpu",
                                             "--tokenizer", "gpt2", "--vocab-file", "v", "--merges-file", "m"});
  EXPECT_EQ(gen.load, "ckpt");
  EXPECT_TRUE(gen.prompt_given);  // an empty --prompt is given (generate refuses it, saying so)
  EXPECT_EQ(gen.prompt, "");
  EXPECT_EQ(gen.max_new_tokens, 5);
  EXPECT_EQ(gen.temperature, 0.0);
  EXPECT_EQ(gen.top_k, 40);
  EXPECT_DOUBLE_EQ(gen.top_p, 0.9);
  EXPECT_EQ(gen.seed, UINT64_MAX);
  EXPECT_EQ(gen.num_samples, 3);
  EXPECT_EQ(gen.backend, "cpu");
  EXPECT_EQ(gen.tokenizer, "gpt2");
  EXPECT_EQ(gen.vocab_file, "v");
  EXPECT_EQ(gen.merges_file, "m");
  const auto plain_gen = options<GenerateOptions>({"generate", "--load", "ckpt", "--prompt-file", "p.txt"});
  EXPECT_FALSE(plain_gen.prompt_given);
  EXPECT_EQ(plain_gen.prompt_file, "p.txt");
  EXPECT_EQ(plain_gen.seed, 1234u);
  // A repeated option keeps its last value.
  EXPECT_EQ(options<ScheduleOptions>({"schedule", "--pp", "2", "--pp", "3"}).pp, 3);
  // Negative numbers are values, not options.
  EXPECT_EQ(options<ScheduleOptions>({"schedule", "--pp", "-1"}).pp, -1);
}

TEST(Cli, UnknownOptionsNameTheirSubcommand) {
  for (const Subcommand& s : subcommands()) {
    SCOPED_TRACE(s.name);
    expect_cli_error({s.name, "--bogus", "1"}, "unknown option --bogus for '" + s.name + "'; known: ");
    expect_cli_error({s.name, "--bogus=1"}, "unknown option --bogus for '" + s.name + "'");
    expect_cli_error({s.name, "-x"}, "unknown option -x for '" + s.name + "'");
    expect_cli_error({s.name, "stray"}, "unexpected argument 'stray' for '" + s.name + "'");
    expect_cli_error({s.name, "--bogus"}, "(see 'gpt-train " + s.name + " --help')");
  }
  expect_cli_error({"--bogus", "1"}, "unknown option --bogus for 'train'; known: --config --set --load");
  // An option of another subcommand is unknown here.
  expect_cli_error({"schedule", "--pipeline", "2"}, "unknown option --pipeline for 'schedule'");
  expect_cli_error({"plan", "--config", "c.yaml", "--gpu", "8"}, "unknown option --gpu for 'plan'");
  expect_cli_error({"train", "--config", "c.yaml", "--iters", "3"}, "unknown option --iters for 'train'");
}

TEST(Cli, BadValuesAndRules) {
  expect_cli_error({"eval", "--load", "ckpt", "--iters", "two"}, "--iters expects an integer, got 'two'");
  expect_cli_error({"schedule", "--pp", "4x"}, "--pp expects an integer, got '4x'");
  expect_cli_error({"schedule", "--pp", "1.5"}, "--pp expects an integer, got '1.5'");
  expect_cli_error({"prep", "--input", "a", "--output-prefix", "p", "--workers", "two"},
                   "--workers expects an integer, got 'two'");
  expect_cli_error({"prep", "--input", "a", "--output-prefix", "p", "--shard-mb", "big"},
                   "--shard-mb expects a number, got 'big'");
  expect_cli_error({"prep", "--input", "a", "--output-prefix", "p", "--tokenizer", "words"},
                   "--tokenizer: expected bytes, gpt2 or spm, got 'words'");
  expect_cli_error({"plan", "--config", "c", "--gpus", "8", "--p2p-buffers", "kept"},
                   "--p2p-buffers: expected released or freed, got 'kept'");
  expect_cli_error({"plan", "--config", "c", "--gpus", "eight"}, "--gpus expects an integer, got 'eight'");
  expect_cli_error({"eval", "--config", "c", "--random-init=maybe"}, "--random-init");
  // Options without their value.
  expect_cli_error({"train", "--config"}, "--config needs FILE");
  expect_cli_error({"train", "--set"}, "--set needs key.path=value");
  expect_cli_error({"train", "--set", "--config", "c.yaml"}, "--set needs key.path=value");
  expect_cli_error({"prep", "--input", "--output-prefix", "p"}, "--input needs FILE|DIR");
  expect_cli_error({"train", "--config="}, "--config needs FILE");
  expect_cli_error({"train", "--config", ""}, "--config needs FILE");
  expect_cli_error({"train", "--config", "--set", "a.b=1"}, "--config needs FILE");
  expect_cli_error({"prep", "--input", "a", "--output-prefix"}, "--output-prefix needs P");
  // A value that starts with "--" is given as --name=VALUE.
  EXPECT_EQ(options<PrepOptions>({"prep", "--input", "a", "--output-prefix", "p", "--doc-separator=--"}).doc_separator,
            std::optional<std::string>("--"));
  expect_cli_error({"train", "--config", "a", "--config", "b"}, "--config given twice ('a' and 'b')");
  expect_cli_error({"train", "--set", "novalue"}, "--set 'novalue': expected key.path=value");
  expect_cli_error({"train", "--set", "=1"}, "--set '=1': expected key.path=value");
  // Rules between options.
  expect_cli_error({"eval", "--load", "ckpt", "--iters", "-3"},
                   "--iters -3: expected a number of batches >= 0 (0 evaluates each split once through)");
  expect_cli_error({"eval", "--config", "c", "--random-init", "--load", "ckpt"},
                   "--random-init evaluates the initial weights and --load a checkpoint's");
  expect_cli_error({"prep", "--output-prefix", "p"},
                   "--input (or --from-megatron) is required (see 'gpt-train prep --help')");
  expect_cli_error({"prep", "--from-megatron", "m", "--input", "a", "--output-prefix", "p"},
                   "--from-megatron and --input exclude each other");
  expect_cli_error({"generate", "--load", "ckpt", "--seed", "-1"}, "--seed expects a non-negative integer, got '-1'");
  expect_cli_error({"prep", "--input", "a"}, "--output-prefix is required");
  expect_cli_error({"prep", "--input", "a", "--output-prefix", "p", "--shard-mb", "0"}, "must be positive");
  expect_cli_error({"prep", "--input", "a", "--output-prefix", "p", "--workers", "-1"}, "--workers must be >= 0");
  expect_cli_error({"plan", "--config", "c.yaml"}, "--gpus N is required");
  expect_cli_error({"plan", "--gpus", "8"}, "--config FILE is required");
  expect_cli_error({"plan", "--config", "c.yaml", "--gpus", "0"}, "--gpus must be at least 1");
  expect_cli_error({"convert", "--from", "ckpt"}, "convert needs --from and --to");
  expect_cli_error({"convert", "--from", "m.safetensors", "--to", "dir"}, "needs --config FILE");
}

TEST(Cli, UnknownSubcommands) {
  expect_cli_error({"trian"}, "unknown subcommand 'trian' (did you mean 'train'?)");
  expect_cli_error({"pre"}, "(did you mean 'prep'?)");
  expect_cli_error({"frobnicate"}, "known: train, eval, prep, schedule, config, plan, convert, generate");
  expect_cli_error({"configs/tiny-cpu.yaml"}, "gpt-train train --config configs/tiny-cpu.yaml");
  expect_cli_error({"help", "trian"}, "unknown subcommand 'trian'");
}

TEST(Cli, OverviewListsEverySubcommand) {
  std::string text = usage_text();
  for (const Subcommand& s : subcommands()) {
    EXPECT_NE(text.find("  " + s.name + " "), std::string::npos) << s.name;
    EXPECT_NE(text.find(s.summary.substr(0, 40)), std::string::npos) << s.name;
  }
  EXPECT_NE(text.find("--set key.path=value"), std::string::npos);
  EXPECT_NE(text.find("--config FILE"), std::string::npos);
  EXPECT_EQ(parse({"--help"}).help_text, text);
  std::vector<std::string> names;
  for (const Subcommand& s : subcommands()) names.push_back(s.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"train", "eval", "prep", "schedule", "config", "plan", "convert", "generate"}));
}

TEST(Cli, ArgcArgvFormAndRun) {
  const char* argv[] = {"gpt-train", "schedule", "--pp", "2", "--microbatches", "2"};
  CommandLine c = parse_command_line(6, const_cast<char**>(argv));
  EXPECT_EQ(c.command, "schedule");
  EXPECT_EQ(c.get<ScheduleOptions>().pp, 2);
  testing::internal::CaptureStdout();
  EXPECT_EQ(c.run(), 0);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("rank"), std::string::npos);
}

}  // namespace
}  // namespace gpt
