#include "megatron/flags/command_line.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/core/strings.h"

namespace megatron::flags {

namespace {

size_t find_flag(const CommandSyntax& syntax, std::string_view name) {
  for (size_t i = 0; i < syntax.flags.size(); ++i)
    if (syntax.flags[i].name == name) return i;
  return syntax.flags.size();
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), size_t(0));
  for (size_t i = 0; i < a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i + 1;
    for (size_t j = 0; j < b.size(); ++j) {
      const size_t above = row[j + 1];
      row[j + 1] = std::min({above + 1, row[j] + 1, diagonal + (a[i] == b[j] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The known flag closest to an unknown one, when it is close enough to be a typo.
const FlagSyntax* closest_flag(const CommandSyntax& syntax, std::string_view name) {
  const FlagSyntax* best = nullptr;
  // Allow about one edit in three characters of the name after "--".
  size_t best_distance = std::max<size_t>(2, (name.size() - std::min<size_t>(name.size(), 2)) / 3) + 1;
  for (const FlagSyntax& flag : syntax.flags) {
    const size_t distance = edit_distance(name, flag.name);
    if (distance < best_distance) {
      best = &flag;
      best_distance = distance;
    }
  }
  return best;
}

std::string yaml_key(const std::string& flag_name) {
  std::string key = flag_name.substr(2);
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

std::string flag_name_for_key(const std::string& key) {
  std::string name = "--" + key;
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

std::string unknown_flag(const CommandSyntax& syntax, const std::string& where, const std::string& name, bool yaml) {
  for (const NotBuilt& megatron_flag : syntax.not_built)
    if (megatron_flag.name == name) return concat(where, ": Megatron's flag, not built here: ", megatron_flag.instead);
  const FlagSyntax* close = closest_flag(syntax, name);
  const char* what = yaml ? "key" : "flag";
  if (close == nullptr) {
    return concat(where, ": unknown ", what, "; ", syntax.command, " does not support it (see ", syntax.command,
                  " --help for the flags it does)");
  }
  return concat(where, ": unknown ", what, "; did you mean ", yaml ? yaml_key(close->name) : close->name, "?");
}

void add_once(std::vector<Assignment>& assignments, Assignment assignment, std::vector<std::string>& problems) {
  for (const Assignment& earlier : assignments) {
    if (earlier.flag == assignment.flag) {
      problems.push_back(concat(assignment.where, " is given twice (first as ", earlier.where, "): keep one"));
      return;
    }
  }
  assignments.push_back(std::move(assignment));
}

bool is_flag_token(const std::string& token) { return token.rfind("--", 0) == 0; }

std::vector<Assignment> assignments_from_argv(const CommandSyntax& syntax, const std::vector<std::string>& argv,
                                              std::vector<std::string>& problems) {
  std::vector<Assignment> assignments;
  size_t i = 0;
  while (i < argv.size()) {
    const std::string& token = argv[i++];
    if (!is_flag_token(token)) {
      problems.push_back(concat("'", token, "' follows no flag: values come right after their flag, ",
                                "e.g. --flag VALUE or --flag=VALUE"));
      continue;
    }
    const size_t equals = token.find('=');
    const std::string name = token.substr(0, equals);
    const size_t index = find_flag(syntax, name);
    if (index == syntax.flags.size()) {
      problems.push_back(unknown_flag(syntax, name, name, false));
      while (i < argv.size() && !is_flag_token(argv[i])) ++i;  // its values, so they do not pile up errors
      continue;
    }
    const Arity arity = syntax.flags[index].arity;
    Assignment assignment{index, {}, name};
    if (equals != std::string::npos) assignment.values.push_back(token.substr(equals + 1));
    if (arity == Arity::none) {
      if (!assignment.values.empty()) {
        problems.push_back(concat(token, ": ", name, " takes no value; write ", name, " alone"));
        continue;
      }
      assignment.values.push_back("true");
    } else if (arity == Arity::many) {
      while (i < argv.size() && !is_flag_token(argv[i])) assignment.values.push_back(argv[i++]);
      if (assignment.values.empty()) {
        problems.push_back(concat(name, " needs at least one value: write ", name, " V1 [V2 ...]"));
        continue;
      }
    } else if (assignment.values.empty()) {
      if (i == argv.size() || is_flag_token(argv[i])) {
        problems.push_back(concat(name, " needs a value: write ", name, " VALUE or ", name, "=VALUE"));
        continue;
      }
      assignment.values.push_back(argv[i++]);
    }
    add_once(assignments, std::move(assignment), problems);
  }
  return assignments;
}

// The text values of one YAML entry, or a problem.
std::optional<std::vector<std::string>> yaml_values(Arity arity, const YAML::Node& node, const std::string& where,
                                                    std::vector<std::string>& problems) {
  if (arity == Arity::none) {
    bool value = false;
    if (node.IsScalar() && YAML::convert<bool>::decode(node, value))
      return std::vector<std::string>{value ? "true" : "false"};
    problems.push_back(concat(where, ": expected true or false"));
    return std::nullopt;
  }
  if (arity == Arity::many) {
    if (node.IsScalar()) return split_words(node.Scalar());
    std::vector<std::string> values;
    for (size_t i = 0; node.IsSequence() && i < node.size(); ++i) {
      if (!node[i].IsScalar()) break;
      values.push_back(node[i].Scalar());
    }
    if (node.IsSequence() && values.size() == node.size()) return values;
    problems.push_back(concat(where, ": expected a list of strings, e.g. [0.3, corpus-a, 0.7, corpus-b]"));
    return std::nullopt;
  }
  if (!node.IsScalar()) {
    problems.push_back(concat(where, ": expected a single value, not a list or mapping"));
    return std::nullopt;
  }
  return std::vector<std::string>{node.Scalar()};
}

std::vector<Assignment> assignments_from_yaml(const CommandSyntax& syntax, const std::string& path,
                                              std::vector<std::string>& problems) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    problems.push_back(
        concat("--config ", path, ": cannot be read as YAML (", e.what(), "); fix the path or the file"));
    return {};
  }
  if (root.IsNull()) return {};
  if (!root.IsMap()) {
    const auto example = std::find_if(syntax.flags.begin(), syntax.flags.end(),
                                      [](const FlagSyntax& f) { return f.arity == Arity::one; });
    problems.push_back(concat("--config ", path, ": expected a mapping of flag names to values, e.g. ",
                              example == syntax.flags.end() ? "key" : yaml_key(example->name), ": VALUE"));
    return {};
  }
  std::vector<Assignment> assignments;
  for (const auto& entry : root) {
    const std::string key = entry.first.Scalar();
    const std::string where = concat(path, ": ", key);
    const size_t index = find_flag(syntax, flag_name_for_key(key));
    if (index == syntax.flags.size()) {
      problems.push_back(unknown_flag(syntax, where, flag_name_for_key(key), true));
      continue;
    }
    const Arity arity = syntax.flags[index].arity;
    if (arity == Arity::config) {
      problems.push_back(concat(where, ": a config file cannot name another one; merge the two files"));
      continue;
    }
    if (entry.second.IsNull()) continue;  // "key:" or "key: null" means not given
    auto values = yaml_values(arity, entry.second, where, problems);
    if (values) add_once(assignments, Assignment{index, std::move(*values), where}, problems);
  }
  return assignments;
}

}  // namespace

std::vector<std::vector<Assignment>> read_command_line(const CommandSyntax& syntax,
                                                       const std::vector<std::string>& argv,
                                                       std::vector<std::string>& problems) {
  std::vector<Assignment> command_line = assignments_from_argv(syntax, argv, problems);
  std::vector<Assignment> config_file;
  for (const Assignment& assignment : command_line) {
    if (syntax.flags[assignment.flag].arity == Arity::config)
      config_file = assignments_from_yaml(syntax, assignment.values.front(), problems);
  }
  return {std::move(config_file), std::move(command_line)};
}

std::vector<Assignment> read_flag_pairs(const CommandSyntax& syntax,
                                        const std::vector<std::pair<std::string, std::string>>& pairs,
                                        std::vector<std::string>& problems) {
  std::vector<Assignment> assignments;
  for (const auto& [name, text] : pairs) {
    const size_t index = find_flag(syntax, name);
    if (index == syntax.flags.size()) {
      problems.push_back(unknown_flag(syntax, name, name, false));
      continue;
    }
    const Arity arity = syntax.flags[index].arity;
    if (arity == Arity::config) {
      problems.push_back(concat(name, ": stored flags hold merged values and cannot name a config file; drop it"));
      continue;
    }
    std::vector<std::string> values = arity == Arity::many ? split_words(text) : std::vector{text};
    add_once(assignments, Assignment{index, std::move(values), name}, problems);
  }
  return assignments;
}

void throw_problems(const std::vector<std::string>& problems, std::string_view note) {
  std::ostringstream os;
  os << problems.size() << (problems.size() == 1 ? " problem" : " problems") << " with the arguments:";
  for (const std::string& problem : problems) os << "\n  - " << problem;
  if (!note.empty()) os << "\n" << note;
  throw Error(os.str());
}

std::optional<int64_t> parse_int(std::string_view text) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

namespace {
template <class Real>
std::optional<Real> parse_real(std::string_view text) {
  Real value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

template <class Real>
std::string format(Real value) {
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, end);
}
}  // namespace

std::optional<double> parse_double(std::string_view text) { return parse_real<double>(text); }
std::optional<float> parse_float(std::string_view text) { return parse_real<float>(text); }
std::string format_real(double value) { return format(value); }
std::string format_real(float value) { return format(value); }

std::vector<std::string> split_words(std::string_view text) {
  std::istringstream is{std::string(text)};
  std::vector<std::string> words;
  for (std::string word; is >> word;) words.push_back(word);
  return words;
}

std::string format_help(std::string_view intro, const std::vector<HelpRow>& rows) {
  constexpr size_t kColumn = 44;
  std::ostringstream os;
  os << intro;
  std::string section;
  for (const HelpRow& row : rows) {
    if (row.section != section) {
      section = row.section;
      os << "\n" << section << ":\n";
    }
    const std::string left = "  " + row.flag;
    os << left;
    if (left.size() >= kColumn) {
      os << "\n" << std::string(kColumn, ' ');
    } else {
      os << std::string(kColumn - left.size(), ' ');
    }
    os << row.help << "\n";
  }
  return os.str();
}

}  // namespace megatron::flags
