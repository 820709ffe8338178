#pragma once
// Subcommands of the `megatron` executable. Each takes the arguments after its name and
// returns the process exit code; errors are thrown as megatron::Error and reported by main.
// Each declares its flags as one table (flags/flag_table.h), which also writes its --help.
#include <string>
#include <vector>

namespace megatron::tools {

using Args = std::vector<std::string>;

int train(const Args& args);
int preprocess_data(const Args& args);
int generate(const Args& args);
int train_tokenizer(const Args& args);
int import_hf(const Args& args);
int export_hf(const Args& args);
int doctor(const Args& args);
int plan(const Args& args);

std::string train_help();
std::string preprocess_data_help();
std::string generate_help();
std::string train_tokenizer_help();
std::string import_hf_help();
std::string export_hf_help();
std::string doctor_help();
std::string plan_help();

}  // namespace megatron::tools
