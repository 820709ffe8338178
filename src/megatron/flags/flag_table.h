#pragma once
// The one flag machinery of every subcommand. A subcommand declares a table: one row per flag,
// naming the flag (Megatron's name where Megatron has it), the field of its options struct that
// the flag fills, a help section and text, and for enum and restricted string fields the allowed
// values:
//
//   #define FIELD(member) MEGATRON_FLAG_FIELD(PreprocessOptions, member)
//   const FlagTable<PreprocessOptions> table("megatron preprocess-data", "usage: ...\n", {
//       {"--input", FIELD(input), "input and output", "JSON-lines file to convert; required"},
//       {"--append-eod", Switch{FIELD(append_eod), true}, "processing", "..."},
//   }, validate);
//
// The table then parses `--flag VALUE` and `--flag=VALUE` (and the YAML file --config names, where
// the table has a ConfigFile row; command-line flags override it), reports every problem at once
// (unknown flags with the closest known one, values of the wrong kind, a flag given twice, then
// the table's validator), generates --help, and writes options back as flag text (checkpoints).
#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/core/strings.h"
#include "megatron/flags/command_line.h"

namespace megatron::flags {

// A field of the options struct, reached from the struct (fields of nested structs too).
template <class Options, class T>
using FieldRef = T& (*)(Options&);

#define MEGATRON_FLAG_FIELD(Options, member) \
  [](Options & options) -> auto& { return options.member; }

// store_true (the flag sets the field) or store_false (--disable-bias-linear clears add_bias_linear).
template <class Options>
struct Switch {
  FieldRef<Options, bool> field;
  bool value_when_given;
};

// An enum field, read and written as its index into Flag::choices (listed in enum order).
template <class Options>
struct EnumField {
  int (*get)(Options&);
  void (*set)(Options&, int);
};

// --config FILE: read by the parser itself; it sets no field.
struct ConfigFile {};

// std::optional fields are unset by default, and written as "" when unset.
template <class Options>
using Field = std::variant<FieldRef<Options, int64_t>, FieldRef<Options, double>, FieldRef<Options, float>,
                           FieldRef<Options, std::string>, FieldRef<Options, std::vector<std::string>>,
                           FieldRef<Options, std::optional<int64_t>>, FieldRef<Options, std::optional<double>>,
                           Switch<Options>, EnumField<Options>, ConfigFile>;

template <class Options>
struct Flag {
  // (A constructor rather than an aggregate: GCC 12 crashes on the default member initializer.)
  Flag(std::string name_, Field<Options> field_, std::string section_, std::string help_,
       std::vector<std::string> choices_ = {})
      : name(std::move(name_)),
        field(field_),
        section(std::move(section_)),
        help(std::move(help_)),
        choices(std::move(choices_)) {}

  std::string name;  // "--num-layers"
  Field<Options> field;
  std::string section;
  std::string help;
  std::vector<std::string> choices;  // allowed values of enum and restricted string fields
};

namespace detail {
template <class Accessor>
struct AccessorTraits;
template <class Options, class T>
struct AccessorTraits<T& (*)(Options&)> {
  using options = Options;
  using value = T;
};
template <class Ref>
using AccessorOf = AccessorTraits<decltype(+Ref{})>;
}  // namespace detail

// The EnumField of an accessor lambda (MEGATRON_FLAG_FIELD of an enum member).
template <class Ref>
EnumField<typename detail::AccessorOf<Ref>::options> enum_field(Ref) {
  using Options = typename detail::AccessorOf<Ref>::options;
  using Enum = typename detail::AccessorOf<Ref>::value;
  return {[](Options& options) { return int(Ref{}(options)); },
          [](Options& options, int index) { Ref{}(options) = Enum(index); }};
}

template <class Options>
class FlagTable {
 public:
  // Every rule the parsed options break, one message each (value, rule, fix).
  using Validate = std::vector<std::string> (*)(const Options&);

  // `command` names the subcommand in messages ("megatron train"); `intro` opens --help.
  // `not_built`: Megatron's flags the subcommand knows it lacks, each with what to do instead.
  FlagTable(std::string command, std::string intro, std::vector<Flag<Options>> flags, Validate validate = nullptr,
            std::vector<NotBuilt> not_built = {});

  const CommandSyntax& syntax() const { return syntax_; }
  // The row of a flag of this table; throws for any other name.
  size_t index_of(std::string_view name) const;

  // The words after the subcommand: defaults, overridden by the --config file, overridden by the
  // command line; then the validator. Throws one Error listing every problem.
  Options parse(const std::vector<std::string>& argv) const;

  // Writes layers of assignments (in increasing precedence) into `options`; appends the problem
  // of each value that does not fit its field.
  void apply(const std::vector<std::vector<Assignment>>& layers, Options& options,
             std::vector<std::string>& problems) const;

  // Generated from the rows: the intro, then each section's flags with their value's kind, their
  // help, their choices and their default.
  std::string help() const;

  // One pair per row except --config, in table order: each field's value as flag text ("true" or
  // "false" for switches, list values separated by spaces, "" for unset optionals, empty strings
  // and empty lists); read back by read_pairs.
  std::vector<std::pair<std::string, std::string>> to_flags(const Options& options) const;
  std::vector<Assignment> read_pairs(const std::vector<std::pair<std::string, std::string>>& pairs,
                                     std::vector<std::string>& problems) const {
    return read_flag_pairs(syntax_, pairs, problems);
  }

  // Restricted string fields that hold none of their choices (values set by code rather than by the
  // parser); "" passes where the default is "".
  void check_choices(const Options& options, std::vector<std::string>& problems) const;

 private:
  std::string value_text(size_t flag, const Options& options) const;
  std::string metavar(const Flag<Options>& flag) const;

  std::string intro_;
  std::vector<Flag<Options>> flags_;
  Validate validate_;
  CommandSyntax syntax_;
};

// ---- implementation ---------------------------------------------------------------------------

namespace detail {

// The accessors take a mutable struct; reading through them changes nothing.
template <class Options>
Options& readable(const Options& options) {
  return const_cast<Options&>(options);
}

template <class Options>
struct ArityOf {
  template <class T>
  Arity operator()(FieldRef<Options, T>) const {
    return std::is_same_v<T, std::vector<std::string>> ? Arity::many : Arity::one;
  }
  Arity operator()(Switch<Options>) const { return Arity::none; }
  Arity operator()(EnumField<Options>) const { return Arity::one; }
  Arity operator()(ConfigFile) const { return Arity::config; }
};

inline constexpr std::string_view kInteger = "an integer (a whole number such as 8)";
inline constexpr std::string_view kNumber = "a number (such as 0.01 or 3e-4)";

// Writes one assignment into the options; returns the problem, or "" when it applied.
template <class Options>
struct Writer {
  const Flag<Options>& flag;
  const Assignment& a;
  Options& options;

  const std::string& text() const { return a.values.front(); }
  std::string bad(std::string_view expected) const { return concat(a.where, " '", text(), "': expected ", expected); }
  template <class T>
  std::string set(FieldRef<Options, T> ref, const std::optional<T>& value, std::string_view expected) const {
    if (!value) return bad(expected);
    ref(options) = *value;
    return {};
  }
  // "" is unset (to_flags writes an unset value so).
  template <class T>
  std::string set(FieldRef<Options, std::optional<T>> ref, const std::optional<T>& value,
                  std::string_view expected) const {
    if (text().empty()) {
      ref(options).reset();
      return {};
    }
    if (!value) return bad(expected);
    ref(options) = *value;
    return {};
  }

  std::string operator()(FieldRef<Options, int64_t> ref) const { return set(ref, parse_int(text()), kInteger); }
  std::string operator()(FieldRef<Options, double> ref) const { return set(ref, parse_double(text()), kNumber); }
  std::string operator()(FieldRef<Options, float> ref) const { return set(ref, parse_float(text()), kNumber); }
  std::string operator()(FieldRef<Options, std::optional<int64_t>> ref) const {
    return set(ref, parse_int(text()), kInteger);
  }
  std::string operator()(FieldRef<Options, std::optional<double>> ref) const {
    return set(ref, parse_double(text()), kNumber);
  }
  std::string operator()(FieldRef<Options, std::string> ref) const {
    const auto& choices = flag.choices;
    if (!choices.empty() && !text().empty() && std::find(choices.begin(), choices.end(), text()) == choices.end())
      return bad(concat("one of ", join(choices, ", ")));
    ref(options) = text();
    return {};
  }
  std::string operator()(FieldRef<Options, std::vector<std::string>> ref) const {
    ref(options) = a.values;
    return {};
  }
  std::string operator()(Switch<Options> s) const {
    if (text() != "true" && text() != "false") return bad("true or false");
    s.field(options) = text() == "true" ? s.value_when_given : !s.value_when_given;
    return {};
  }
  std::string operator()(EnumField<Options> e) const {
    const auto& choices = flag.choices;
    const auto it = std::find(choices.begin(), choices.end(), text());
    if (it == choices.end()) return bad(concat("one of ", join(choices, ", ")));
    e.set(options, int(it - choices.begin()));
    return {};
  }
  std::string operator()(ConfigFile) const { return {}; }  // already read by the parser
};

template <class Options>
struct Reader {
  const Flag<Options>& flag;
  Options& options;

  std::string operator()(FieldRef<Options, int64_t> ref) const { return std::to_string(ref(options)); }
  std::string operator()(FieldRef<Options, double> ref) const { return format_real(ref(options)); }
  std::string operator()(FieldRef<Options, float> ref) const { return format_real(ref(options)); }
  std::string operator()(FieldRef<Options, std::optional<int64_t>> ref) const {
    return ref(options) ? std::to_string(*ref(options)) : std::string();
  }
  std::string operator()(FieldRef<Options, std::optional<double>> ref) const {
    return ref(options) ? format_real(*ref(options)) : std::string();
  }
  std::string operator()(FieldRef<Options, std::string> ref) const { return ref(options); }
  std::string operator()(FieldRef<Options, std::vector<std::string>> ref) const { return join(ref(options), " "); }
  std::string operator()(Switch<Options> s) const { return s.field(options) == s.value_when_given ? "true" : "false"; }
  std::string operator()(EnumField<Options> e) const { return flag.choices.at(size_t(e.get(options))); }
  std::string operator()(ConfigFile) const { return {}; }
};

}  // namespace detail

template <class Options>
FlagTable<Options>::FlagTable(std::string command, std::string intro, std::vector<Flag<Options>> flags,
                              Validate validate, std::vector<NotBuilt> not_built)
    : intro_(std::move(intro)),
      flags_(std::move(flags)),
      validate_(validate),
      syntax_{std::move(command), {}, std::move(not_built)} {
  for (const Flag<Options>& flag : flags_)
    syntax_.flags.push_back({flag.name, std::visit(detail::ArityOf<Options>{}, flag.field)});
}

template <class Options>
size_t FlagTable<Options>::index_of(std::string_view name) const {
  for (size_t i = 0; i < flags_.size(); ++i)
    if (flags_[i].name == name) return i;
  MEGATRON_FAIL(syntax_.command << " has no flag " << name);
}

template <class Options>
Options FlagTable<Options>::parse(const std::vector<std::string>& argv) const {
  std::vector<std::string> problems;
  const auto layers = read_command_line(syntax_, argv, problems);
  Options options;
  apply(layers, options, problems);
  if (!problems.empty()) throw_problems(problems, validate_ ? "(the consistency checks run once these are fixed)" : "");
  if (validate_) {
    problems = validate_(options);
    if (!problems.empty()) throw_problems(problems);
  }
  return options;
}

template <class Options>
void FlagTable<Options>::apply(const std::vector<std::vector<Assignment>>& layers, Options& options,
                               std::vector<std::string>& problems) const {
  for (const auto& layer : layers) {
    for (const Assignment& assignment : layer) {
      const Flag<Options>& flag = flags_.at(assignment.flag);
      std::string problem = std::visit(detail::Writer<Options>{flag, assignment, options}, flag.field);
      if (!problem.empty()) problems.push_back(std::move(problem));
    }
  }
}

template <class Options>
std::string FlagTable<Options>::value_text(size_t flag, const Options& options) const {
  const Flag<Options>& row = flags_.at(flag);
  return std::visit(detail::Reader<Options>{row, detail::readable(options)}, row.field);
}

template <class Options>
std::vector<std::pair<std::string, std::string>> FlagTable<Options>::to_flags(const Options& options) const {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (size_t i = 0; i < flags_.size(); ++i)
    if (!std::holds_alternative<ConfigFile>(flags_[i].field))
      pairs.emplace_back(flags_[i].name, value_text(i, options));
  return pairs;
}

template <class Options>
void FlagTable<Options>::check_choices(const Options& options, std::vector<std::string>& problems) const {
  const Options defaults{};
  for (size_t i = 0; i < flags_.size(); ++i) {
    const Flag<Options>& flag = flags_[i];
    if (!std::holds_alternative<FieldRef<Options, std::string>>(flag.field) || flag.choices.empty()) continue;
    const std::string value = value_text(i, options);
    const bool unset_allowed = value.empty() && value_text(i, defaults).empty();
    if (!unset_allowed && std::find(flag.choices.begin(), flag.choices.end(), value) == flag.choices.end())
      problems.push_back(concat(flag.name, " ", value, ": expected one of ", join(flag.choices, ", ")));
  }
}

template <class Options>
std::string FlagTable<Options>::metavar(const Flag<Options>& flag) const {
  const std::string all = join(flag.choices, ",");
  const std::string choices = all.size() <= 40 ? "{" + all + "}" : "NAME";
  return std::visit(
      [&](const auto& field) -> std::string {
        using F = std::decay_t<decltype(field)>;
        if constexpr (std::is_same_v<F, Switch<Options>>) return "";
        if constexpr (std::is_same_v<F, ConfigFile>) return "FILE.yaml";
        if constexpr (std::is_same_v<F, EnumField<Options>>) return choices;
        if constexpr (std::is_same_v<F, FieldRef<Options, std::string>>) return flag.choices.empty() ? "STR" : choices;
        if constexpr (std::is_same_v<F, FieldRef<Options, std::vector<std::string>>>) return "STR [STR ...]";
        if constexpr (std::is_same_v<F, FieldRef<Options, int64_t>> ||
                      std::is_same_v<F, FieldRef<Options, std::optional<int64_t>>>)
          return "INT";
        return "FLOAT";
      },
      flag.field);
}

template <class Options>
std::string FlagTable<Options>::help() const {
  const Options defaults{};
  std::vector<HelpRow> rows;
  for (size_t i = 0; i < flags_.size(); ++i) {
    const Flag<Options>& flag = flags_[i];
    const std::string var = metavar(flag);
    HelpRow row{flag.section, var.empty() ? flag.name : flag.name + " " + var, flag.help};
    if (var == "NAME") row.help += "; one of " + join(flag.choices, ", ");
    const std::string value = value_text(i, defaults);
    if (!std::holds_alternative<Switch<Options>>(flag.field) && !value.empty() && value != "0")
      row.help += " [default: " + value + "]";
    rows.push_back(std::move(row));
  }
  return format_help(intro_, rows);
}

}  // namespace megatron::flags
