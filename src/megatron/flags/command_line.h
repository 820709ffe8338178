#pragma once
// The part of the flag machinery that does not depend on the options struct (flag_table.h holds
// the rest): reading a command line, the YAML file its --config names and stored flag/value pairs
// into assignments, with every problem collected (unknown flags with the closest known one, a flag
// given twice, a missing value); text <-> value conversions; the help layout.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megatron/core/strings.h"

namespace megatron::flags {

// How a flag takes its value.
enum class Arity {
  none,    // a switch: the flag alone on the command line, true/false in YAML
  one,     // --flag VALUE or --flag=VALUE
  many,    // --flag V1 [V2 ...]: the words up to the next flag; a list or a string of words in YAML
  config,  // --config FILE.yaml: read by the parser itself
};

struct FlagSyntax {
  std::string name;  // "--num-layers"; its YAML key is num_layers (num-layers is accepted too)
  Arity arity;
};

// A flag of Megatron's that a subcommand knows it does not build, and what to do instead: named
// so in the error rather than as an unknown flag.
struct NotBuilt {
  std::string name;  // "--ckpt-format"
  std::string instead;
};

// Everything the reader needs to know of a subcommand's flags.
struct CommandSyntax {
  std::string command;  // "megatron train", as messages name it
  std::vector<FlagSyntax> flags;
  std::vector<NotBuilt> not_built;
};

// One flag's value from one source, before it is written into the options.
struct Assignment {
  size_t flag;                      // index into CommandSyntax::flags
  std::vector<std::string> values;  // one for Arity::one and none ("true"/"false"); one or more for many
  std::string where;                // as the user wrote it: "--hidden-size" or "run.yaml: hidden_size"
};

// The assignments of argv (the words after the subcommand) and of the --config file it names, in
// increasing precedence: {config file, command line}. Problems are appended, one message each.
std::vector<std::vector<Assignment>> read_command_line(const CommandSyntax& syntax,
                                                       const std::vector<std::string>& argv,
                                                       std::vector<std::string>& problems);

// Stored flag/value text (FlagTable::to_flags): list values separated by spaces, "" for unset.
std::vector<Assignment> read_flag_pairs(const CommandSyntax& syntax,
                                        const std::vector<std::pair<std::string, std::string>>& pairs,
                                        std::vector<std::string>& problems);

// Throws one Error listing every problem ("2 problems with the arguments: ..."), then `note`.
[[noreturn]] void throw_problems(const std::vector<std::string>& problems, std::string_view note = {});

// ---- values as text ---------------------------------------------------------------------------

std::optional<int64_t> parse_int(std::string_view text);
std::optional<double> parse_double(std::string_view text);  // finite values only
std::optional<float> parse_float(std::string_view text);
// The shortest text that reads back to the same value.
std::string format_real(double value);
std::string format_real(float value);
using megatron::join;  // core/strings.h
std::vector<std::string> split_words(std::string_view text);

// ---- help -------------------------------------------------------------------------------------

struct HelpRow {
  std::string section;
  std::string flag;  // "--num-layers INT"
  std::string help;  // with its choices and default appended
};

// `intro`, then the rows under their section headings (a heading whenever the section changes),
// each flag's help in a column.
std::string format_help(std::string_view intro, const std::vector<HelpRow>& rows);

}  // namespace megatron::flags
