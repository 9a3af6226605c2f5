// Every subcommand of gpt-train in one place: one function per subcommand declares its flags (with their
// --help text) into its options struct and the rules between them; define_subcommands lists them with
// the function that runs each. A new subcommand is a define function and one line in that list.
#include <fmt/format.h>

#include "app/cli.h"
#include "app/cli_flags.h"
#include "app/commands.h"
#include "app/convert.h"
#include "app/generate.h"
#include "app/plan.h"
#include "app/plan_explain.h"
#include "app/prep.h"
#include "data/prep_pipeline.h"

namespace gpt {

namespace {

void define_train(Flags& f, TrainOptions& o) {
  f.config(o.config, o.sets);
  f.text("--load", o.load, "DIR",
         "checkpoint to start from (sets checkpoint.load): an iteration directory or one with a latest pointer");
  f.app().footer("Resumes from checkpoint.dir when it holds a checkpoint. Run under mpirun or srun for several "
                 "ranks; 'gpt-train --config FILE' is the same as 'gpt-train train --config FILE'.");
}

void define_eval(Flags& f, EvalOptions& o) {
  f.config(o.config, o.sets);
  f.text("--load", o.load, "DIR",
         "checkpoint to evaluate (an iteration directory or one with a latest pointer); without --config, "
         "the config it was saved with, on a layout that fits any number of ranks");
  f.integer("--iters", o.iters, "batches per split; 0 evaluates each split once through (default: eval.iters)");
  f.flag("--random-init", o.random_init,
         "evaluate the initial weights of training.seed instead of a checkpoint (a baseline)");
  f.check([&o] {
    if (o.iters && *o.iters < 0)
      throw CliError(fmt::format("--iters {}: expected a number of batches >= 0 (0 evaluates each split once through)",
                                 *o.iters));
    if (o.random_init && !o.load.empty())
      throw CliError("--random-init evaluates the initial weights and --load a checkpoint's: give one of them");
  });
  f.app().footer("Reports the validation (and test) loss and perplexity, and appends them to logging.metrics_file.");
}

void define_prep(Flags& f, PrepOptions& o) {
  f.texts("--input", o.inputs, "FILE|DIR",
          "text to tokenize, several allowed: .jsonl/.json/.ndjson files hold one JSON object per line with a "
          "\"text\" field; any other file is plain text; a directory stands for its regular non-binary files");
  f.text("--from-megatron", o.from_megatron, "PREFIX",
         "instead of --input: convert Megatron-LM's indexed dataset PREFIX.bin + PREFIX.idx, already tokenized "
         "with the --tokenizer given (its files do not say which); documents kept, end-of-document appended "
         "where missing");
  f.text("--output-prefix", o.output_prefix, "P", "output path prefix (directories are created)");
  f.choice("--tokenizer", o.tokenizer, {"bytes", "gpt2", "spm"},
           "bytes (vocabulary 257), GPT-2's BPE or SentencePiece");
  f.text("--vocab-file", o.vocab_file, "F", "gpt2: vocab.json; spm: an existing SentencePiece .model");
  f.text("--merges-file", o.merges_file, "F", "gpt2: merges.txt");
  f.integer("--vocab-size", o.vocab_size,
            "spm without --vocab-file: train a byte-fallback BPE of N pieces on the input first and save it as "
            "P.spm.model");
  f.integer("--shard-tokens", o.shard_tokens,
            "tokens per shard (a shard ends at the first document boundary past N); 0: from --shard-mb");
  f.number("--shard-mb", o.shard_mb, "megabytes of stored tokens per shard");
  f.integer("--workers", o.workers, "tokenizer threads; 0: one per hardware thread");
  f.text("--doc-separator", o.doc_separator, "LINE",
         "plain text: a line equal to LINE ends a document (% for fortune files; '' for blank lines); without "
         "it each file is one document");
  f.text("--json-key", o.json_key, "K", "JSON field holding the text");
  f.check([&o] {
    if (!o.from_megatron.empty() && !o.inputs.empty())
      throw CliError("--from-megatron and --input exclude each other: convert a Megatron dataset or tokenize text");
    if (o.inputs.empty() && o.from_megatron.empty()) throw CliError("--input (or --from-megatron) is required");
    if (o.output_prefix.empty()) throw CliError("--output-prefix is required");
    if (o.shard_tokens < 0 || !(o.shard_mb > 0)) throw CliError("--shard-tokens / --shard-mb must be positive");
    if (o.workers < 0) throw CliError("--workers must be >= 0");
  });
  f.app().footer("Tokenizes text into HDF5 shards P_00000.h5, P_00001.h5, ... and the index P.index.json that "
                 "data.train / data.valid name as P. An end-of-document token follows every document. Example:\n"
                 "  gpt-train prep --input /usr/share/games/fortunes --doc-separator % --tokenizer spm "
                 "--vocab-size 4096 --output-prefix data/fortunes");
}

void define_schedule(Flags& f, ScheduleOptions& o) {
  f.integer("--pp", o.pp, "pipeline stages");
  f.integer("--vpp", o.vpp, "virtual stages (model chunks) per rank; > 1 is the interleaved schedule");
  f.integer("--microbatches", o.microbatches, "microbatches per step");
  f.integer("--cp", o.cp, "context-parallel ranks: also print the chunk assignment and the ring attention steps");
}

void define_config(Flags& f, ConfigCommandOptions& o) {
  f.config(o.config, o.sets);
  f.flag("--dump", o.dump, "print every key with its value (what this subcommand does with or without it)");
  f.app().footer("Without --config, the defaults. Stops with the key and the file at the first invalid value.");
}

void define_plan(Flags& f, PlanCommandOptions& o) {
  f.config(o.config, o.sets);
  f.integer("--gpus", o.gpus, "devices to plan for (required unless --probe)");
  f.integer("--gpus-per-node", o.gpus_per_node, "devices per node (default: the hardware's; --probe: 1)");
  f.text("--hardware", o.hardware, "NAME|FILE",
         "a built-in description (a100-80g, h100-80g, h200) or a YAML hardware file (configs/hardware/)");
  f.flag("--json", o.json, "every layout as one JSON document instead of the table");
  f.integer("--top", o.top, "layouts printed in the table");
  f.integer("--max-context", o.max_context,
            "try context parallelism up to this degree (default: the config's parallel.context, 1 = none)");
  f.choice("--recompute", o.recompute, {"none", "selective", "full", "all"}, "activation recomputation; all: try each");
  f.choice("--distributed-optimizer", o.distributed_optimizer, {"on", "off", "all"}, "ZeRO-1; all: try both");
  f.choice("--p2p-buffers", o.p2p_buffers, {"released", "freed"},
           "freed: Megatron-LM's send buffers, released once delivered");
  f.choice("--grad-dtype", o.grad_dtype, {"fp32", "compute"},
           "compute: gradient buffers in the compute dtype, as Megatron-LM's fp16 runs");
  f.choice("--p2p-scatter-gather", o.p2p_scatter_gather, {"on", "off"},
           "on: pipeline sends split over the tensor-parallel ranks (Megatron-LM)");
  f.choice("--attention", o.attention, {"fused", "materialized"},
           "materialized: the 2021 unfused attention, whose scores, softmax and dropout cross memory");
  f.choice("--sp-inputs", o.sp_inputs, {"kept", "regathered"},
           "regathered: Megatron's sequence parallelism, which gathers a linear's input again in backward");
  f.choice("--loss", o.loss, {"fused", "unfused"},
           "unfused: Megatron's cross entropy, whose cast, max, exp, sum and divide each pass over the logits");
  f.text("--overlap", o.overlap, "SET",
         "communication assumed to run beside compute: none, gpt-train (what gpt-train does on the config's "
         "backend; the default), megatron-core, or a list of tp, grad-reduce, param-gather, p2p");
  f.text("--explain", o.explain, "TP,PP,DP[,CP]", "print that layout's full cost breakdown next to the best one");
  f.text("--probe", o.probe, "FILE",
         "measure this machine's CPU backend and write it as a hardware file instead of planning");
  f.integer("--threads", o.threads, "--probe: threads per device (default: OpenMP's)");
  f.check([&o] {
    if (!o.probe.empty()) return;
    if (o.config.empty()) throw CliError("--config FILE is required");
    if (!o.gpus) throw CliError("--gpus N is required");
    if (*o.gpus < 1) throw CliError("--gpus must be at least 1");
    try {
      parse_overlaps(o.overlap, "cpu");  // the names; which set gpt-train means depends on the config
      if (!o.explain.empty()) parse_layout_choice(o.explain);
    } catch (const std::invalid_argument& e) {
      throw CliError(e.what());
    }
    if (!o.explain.empty() && o.json) throw CliError("--explain prints text: leave out --json");
  });
  f.app().footer("Ranks every valid layout (tensor, pipeline, virtual pipeline, data parallel, micro batch, "
                 "recompute, distributed optimizer) by predicted step time, with its memory per device; "
                 "docs/planner.md describes the model.");
}

void define_convert(Flags& f, ConvertOptions& o) {
  f.text("--from", o.from, "SRC",
         "a checkpoint (export), FILE.safetensors (GPT-2 import) or a Hugging Face Llama directory holding "
         "config.json (Llama import)");
  f.text("--to", o.to, "DST",
         "FILE.safetensors (GPT-2 export), a directory for config.json and model.safetensors (Llama export), "
         "or the checkpoint directory to write (import)");
  f.config(o.config, o.sets);
  f.check([&o] {
    if (o.from.empty() || o.to.empty()) throw CliError("convert needs --from and --to");
    if (o.from.ends_with(".safetensors") && o.config.empty())
      throw CliError("importing " + o.from + " needs --config FILE for the model architecture");
  });
  f.app().footer("Exchanges weights with Hugging Face transformers: GPT-2 (transformer.h.{i}.attn.c_attn.weight, "
                 "...) through one safetensors file, or LlamaForCausalLM (model.layers.{i}.self_attn.q_proj.weight, "
                 "...) through a directory with config.json, whose model an import takes (--config then gives the "
                 "other keys). An import writes iteration 0 with the weights only.");
}

// Ranges, the prompt and the world size are checked by generate_main, which knows the checkpoint.
void define_generate(Flags& f, GenerateOptions& o) {
  f.text("--load", o.load, "DIR", "checkpoint to sample from (an iteration directory or one with a latest pointer)");
  f.config(o.config, o.sets);
  CLI::Option* prompt = f.text("--prompt", o.prompt, "TEXT", "the text to continue; without it a sample is a "
                                                            "document from its start");
  f.text("--prompt-file", o.prompt_file, "F", "read the prompt from file F instead");
  f.integer("--max-new-tokens", o.max_new_tokens, "tokens generated per sample at most");
  f.number("--temperature", o.temperature, "softmax temperature; 0 is greedy (argmax)");
  f.integer("--top-k", o.top_k, "sample among the K most likely tokens; 0: all");
  f.number("--top-p", o.top_p, "then among the smallest set of tokens with this probability; 1: all");
  f.integer("--seed", o.seed, "sampling seed: the same seed gives the same samples");
  f.integer("--num-samples", o.num_samples, "samples generated");
  f.text("--backend", o.backend, "cpu|cuda", "where to run (default: the checkpoint's training backend)");
  f.text("--tokenizer", o.tokenizer, "KIND",
         "bytes, gpt2 or spm, for a checkpoint that does not record its tokenizer's files");
  f.text("--vocab-file", o.vocab_file, "F", "with --tokenizer: gpt2's vocab.json, or the spm .model");
  f.text("--merges-file", o.merges_file, "F", "with --tokenizer gpt2: merges.txt");
  f.check([&o, prompt] { o.prompt_given = prompt->count() > 0; });
  f.app().footer("Loads the checkpoint on one rank whatever layout saved it and decodes with a key/value cache. "
                 "The samples go to stdout, the generation speed to stderr.");
}

}  // namespace

void define_subcommands(SubcommandTable& t) {
  using Runs = SubcommandTable::Runs;
  t.add("train", "train a model from a config (the default when the first argument is an option)", Runs::UnderMpi,
        define_train, train_main);
  t.add("eval",
        "validation loss of a checkpoint (--load DIR; its own config unless --config), or of the initial "
        "weights (--random-init)",
        Runs::UnderMpi, define_eval, eval_main);
  t.add("prep", "tokenize text files into HDF5 token shards", Runs::BeforeMpi, define_prep, prep_main);
  t.add("schedule", "print the pipeline schedule table for given pipeline, virtual and microbatch sizes",
        Runs::BeforeMpi, define_schedule, schedule_main);
  t.add("config", "load and validate a config; --dump prints every key with its value", Runs::BeforeMpi,
        define_config, config_main);
  t.add("plan", "rank parallel layouts for a config on N GPUs by predicted step time and memory (--gpus N)",
        Runs::BeforeMpi, define_plan, plan_main);
  t.add("convert", "export a checkpoint to Hugging Face GPT-2 or Llama safetensors, or import one", Runs::BeforeMpi,
        define_convert, convert_main);
  t.add("generate", "sample text from a checkpoint on one rank (--load DIR)", Runs::UnderMpi, define_generate,
        generate_main);
}

}  // namespace gpt
