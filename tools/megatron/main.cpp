// The `megatron` executable: `megatron <subcommand> [flags]`, one subcommand per file here.
// Errors surface as one clear message on stderr and a non-zero exit.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.h"
#include "library_environment.h"
#include "megatron/core/error.h"

namespace {

struct Subcommand {
  const char* name;
  int (*run)(const megatron::tools::Args&);
  std::string (*help)();  // generated from the subcommand's flag table
  const char* summary;
};

constexpr Subcommand kSubcommands[] = {
    {"train", megatron::tools::train, megatron::tools::train_help,
     "train a GPT model (Megatron-LM's pretrain_gpt.py flags)"},
    {"preprocess-data", megatron::tools::preprocess_data, megatron::tools::preprocess_data_help,
     "tokenize JSONL into Megatron .bin/.idx files"},
    {"generate", megatron::tools::generate, megatron::tools::generate_help, "sample text from a checkpoint"},
    {"train-tokenizer", megatron::tools::train_tokenizer, megatron::tools::train_tokenizer_help,
     "train a byte-level BPE tokenizer.json on a corpus"},
    {"import-hf", megatron::tools::import_hf, megatron::tools::import_hf_help,
     "convert a Hugging Face model directory into a checkpoint"},
    {"export-hf", megatron::tools::export_hf, megatron::tools::export_hf_help,
     "write a checkpoint as a Hugging Face model directory"},
    {"doctor", megatron::tools::doctor, megatron::tools::doctor_help,
     "check GPUs, MPI, an all-reduce over the launched ranks and --save before a job"},
    {"plan", megatron::tools::plan, megatron::tools::plan_help,
     "a train command line's peak memory per rank and step time, without running it"},
};

void print_usage(FILE* out) {
  std::fprintf(out, "usage: megatron <subcommand> [flags]    (megatron <subcommand> --help for its flags)\n\n");
  for (const auto& s : kSubcommands) std::fprintf(out, "  %-16s %s\n", s.name, s.summary);
}

bool asks_for_help(const megatron::tools::Args& args) {
  return std::any_of(args.begin(), args.end(), [](const std::string& a) { return a == "--help" || a == "-h"; });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  megatron::tools::set_nccl_defaults();
  const megatron::tools::Args args(argv + 2, argv + argc);
  for (const auto& s : kSubcommands) {
    if (std::strcmp(argv[1], s.name) != 0) continue;
    try {
      if (asks_for_help(args)) {
        std::fputs(s.help().c_str(), stdout);
        return 0;
      }
      return s.run(args);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "megatron %s: error: %s\n", s.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "megatron: unknown subcommand '%s'\n\n", argv[1]);
  print_usage(stderr);
  return 2;
}
