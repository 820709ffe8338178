// The layering of the packages (src/megatron/layers.txt, lowest first): every
// #include "megatron/<package>/..." under src/megatron/ and tools/ must name the including
// package itself or one listed above it. An include of a package further down, a cycle between
// packages, a folder of src/megatron/ that the list lacks, an include that is no package's and a
// relative include that climbs out of its folder are reported with file and line. The checker is
// tried on small planted trees (an upward include, a cycle, an unlisted package), then run on the
// real tree.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;

// Package names, lowest layer first. A line starting with a name lists that package (the rest of
// the line describes it); lines starting with '#' or a space are comments and continuations.
std::vector<std::string> parse_layers(const std::string& text) {
  std::vector<std::string> layers;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line[0] == ' ') continue;
    layers.push_back(line.substr(0, line.find(' ')));
  }
  return layers;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Where a package's files live: src/megatron/<name>/, or <name>/ at the root (the executable).
fs::path package_dir(const fs::path& root, const std::string& name) {
  const fs::path library = root / "src" / "megatron" / name;
  return fs::is_directory(library) ? library : root / name;
}

bool is_source(const fs::path& p) {
  static const std::set<std::string> extensions = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh"};
  return extensions.count(p.extension().string()) > 0;
}

// Every rule the tree under `root` breaks, one message each.
std::vector<std::string> layering_problems(const fs::path& root) {
  std::vector<std::string> problems;
  const fs::path list = root / "src" / "megatron" / "layers.txt";
  const std::vector<std::string> layers = parse_layers(read_text(list));
  std::map<std::string, size_t> level;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!level.emplace(layers[i], i).second) problems.push_back(list.string() + ": " + layers[i] + " is listed twice");
    if (!fs::is_directory(package_dir(root, layers[i])))
      problems.push_back(list.string() + ": " + layers[i] + " is listed but neither src/megatron/" + layers[i] +
                         "/ nor " + layers[i] + "/ exists; remove the line");
  }
  std::vector<fs::path> loose;
  for (const fs::directory_entry& e : fs::directory_iterator(root / "src" / "megatron")) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && !level.count(name))
      problems.push_back("src/megatron/" + name +
                         "/ is not in src/megatron/layers.txt; add it at its place in the order");
    if (e.is_regular_file() && is_source(e.path()))
      problems.push_back(e.path().string() + " lies outside every package; move it into one");
  }

  static const std::regex include_re(R"(^\s*#\s*include\s*["<]([^">]+)[">])");
  std::map<std::string, std::set<std::string>> graph;  // package -> packages it includes
  for (const std::string& package : layers) {
    const fs::path dir = package_dir(root, package);
    if (!fs::is_directory(dir)) continue;
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir))
      if (e.is_regular_file() && is_source(e.path())) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      std::ifstream in(file);
      int line_number = 0;
      for (std::string line; std::getline(in, line);) {
        ++line_number;
        std::smatch m;
        if (!std::regex_search(line, m, include_re)) continue;
        const std::string target = m[1].str();
        const std::string where = fs::relative(file, root).string() + ":" + std::to_string(line_number) + ": ";
        if (target.find("..") != std::string::npos) {
          problems.push_back(where + "\"" + target +
                             "\" climbs out of its folder; include it as megatron/<package>/...");
          continue;
        }
        if (target.rfind("megatron/", 0) != 0) continue;  // system, third-party or same-folder headers
        const size_t slash = target.find('/', 9);
        const std::string to = slash == std::string::npos ? "" : target.substr(9, slash - 9);
        if (!level.count(to)) {
          problems.push_back(where + "\"" + target + "\" is in no package of src/megatron/layers.txt");
          continue;
        }
        if (to == package) continue;
        graph[package].insert(to);
        if (level[to] > level[package])
          problems.push_back(where + package + " includes " + to + " (\"" + target + "\"), which lies above it in " +
                             "src/megatron/layers.txt; move the code to the lower package or reorder the list");
      }
    }
  }

  // Cycles between packages (Tarjan's strongly connected components). Each needs an include
  // upwards, reported above too; naming the members shows what to untangle.
  std::map<std::string, int> index, low;
  std::vector<std::string> stack;
  std::set<std::string> on_stack;
  int counter = 0;
  std::function<void(const std::string&)> visit = [&](const std::string& v) {
    index[v] = low[v] = counter++;
    stack.push_back(v);
    on_stack.insert(v);
    for (const std::string& w : graph[v]) {
      if (!index.count(w)) {
        visit(w);
        low[v] = std::min(low[v], low[w]);
      } else if (on_stack.count(w)) {
        low[v] = std::min(low[v], index[w]);
      }
    }
    if (low[v] != index[v]) return;
    std::vector<std::string> component;
    std::string w;
    do {
      w = stack.back();
      stack.pop_back();
      on_stack.erase(w);
      component.push_back(w);
    } while (w != v);
    if (component.size() < 2) return;
    std::sort(component.begin(), component.end());
    std::string names;
    for (const std::string& c : component) names += (names.empty() ? "" : ", ") + c;
    problems.push_back("packages that include each other (a cycle): " + names);
  };
  for (const std::string& package : layers)
    if (!index.count(package)) visit(package);
  return problems;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += "  " + l + "\n";
  return s;
}

// A planted tree: layers.txt with `layers` and one file per (path, text).
class PlantedTree {
 public:
  PlantedTree(const std::string& layers, const std::map<std::string, std::string>& files) {
    fs::create_directories(dir_.path() + "/src/megatron");
    std::ofstream(dir_ / "src/megatron/layers.txt") << layers;
    for (const auto& [path, text] : files) {
      fs::create_directories(fs::path(dir_ / path).parent_path());
      std::ofstream(dir_ / path) << text;
    }
  }
  std::vector<std::string> problems() const { return layering_problems(dir_.path()); }

 private:
  megatron::testing::TempDir dir_;
};

bool mentions(const std::vector<std::string>& problems, const std::string& text) {
  return std::any_of(problems.begin(), problems.end(),
                     [&](const std::string& p) { return p.find(text) != std::string::npos; });
}

const std::string kTwoLayers =
    "# lowest first\ncore      tensors\n          and more\nops       kernels\ntools     the executable\n";

}  // namespace

TEST(IncludeLayers, DownwardIncludesPass) {
  const PlantedTree tree(kTwoLayers, {{"src/megatron/core/a.h", "#include <vector>\n#include \"megatron/core/b.h\"\n"},
                                      {"src/megatron/core/b.h", ""},
                                      {"src/megatron/ops/c.cpp", "#include \"megatron/core/a.h\"\n#include \"c.h\"\n"},
                                      {"tools/megatron/main.cpp", "#include \"megatron/ops/c.h\"\n"}});
  EXPECT_TRUE(tree.problems().empty()) << joined(tree.problems());
}

TEST(IncludeLayers, AnUpwardIncludeFailsNamingFileLineAndPackages) {
  const PlantedTree tree(kTwoLayers, {{"src/megatron/core/a.h", "// a\n#include \"megatron/ops/c.h\"\n"},
                                      {"src/megatron/ops/c.h", ""},
                                      {"tools/megatron/main.cpp", ""}});
  const std::vector<std::string> problems = tree.problems();
  ASSERT_EQ(problems.size(), 1u) << joined(problems);
  EXPECT_TRUE(mentions(problems, "src/megatron/core/a.h:2: core includes ops (\"megatron/ops/c.h\"), which lies above"))
      << joined(problems);
}

TEST(IncludeLayers, ACycleFailsNamingItsPackages) {
  const PlantedTree tree(kTwoLayers, {{"src/megatron/core/a.h", "#include \"megatron/ops/c.h\"\n"},
                                      {"src/megatron/ops/c.h", "#include \"megatron/core/a.h\"\n"},
                                      {"tools/megatron/main.cpp", ""}});
  const std::vector<std::string> problems = tree.problems();
  EXPECT_TRUE(mentions(problems, "packages that include each other (a cycle): core, ops")) << joined(problems);
  EXPECT_TRUE(mentions(problems, "core includes ops")) << joined(problems);
}

TEST(IncludeLayers, UnlistedPackagesStrayIncludesAndStaleLinesFail) {
  const PlantedTree tree(kTwoLayers, {{"src/megatron/core/a.h", "#include \"../ops/c.h\"\n"},
                                      {"src/megatron/ops/c.h", "#include \"megatron/newpkg/d.h\"\n"},
                                      {"src/megatron/newpkg/d.h", ""},
                                      {"src/megatron/loose.cpp", ""}});
  const std::vector<std::string> problems = tree.problems();
  EXPECT_EQ(problems.size(), 5u) << joined(problems);
  EXPECT_TRUE(mentions(problems, "src/megatron/newpkg/ is not in src/megatron/layers.txt")) << joined(problems);
  EXPECT_TRUE(mentions(problems, "src/megatron/ops/c.h:1: \"megatron/newpkg/d.h\" is in no package"))
      << joined(problems);
  EXPECT_TRUE(mentions(problems, "src/megatron/core/a.h:1: \"../ops/c.h\" climbs out")) << joined(problems);
  EXPECT_TRUE(mentions(problems, "loose.cpp lies outside every package")) << joined(problems);
  EXPECT_TRUE(mentions(problems, "tools is listed but")) << joined(problems);
}

TEST(IncludeLayers, TheSourceTreeFollowsItsLayers) {
  const std::vector<std::string> problems = layering_problems(MEGATRON_SOURCE_ROOT);
  EXPECT_TRUE(problems.empty()) << problems.size() << " layering problem(s):\n" << joined(problems);
  EXPECT_GE(parse_layers(read_text(fs::path(MEGATRON_SOURCE_ROOT) / "src/megatron/layers.txt")).size(), 10u);
}
