#include "megatron/pipeline_parallel/stage_split.h"

#include <algorithm>
#include <cctype>
#include <numeric>
#include <string_view>

#include "megatron/core/error.h"
#include "megatron/core/strings.h"

namespace megatron::pipeline_parallel {

StageLayers PipelineSplit::stage(int64_t rank, int64_t chunk) const {
  const int64_t s = chunk * pipeline_size + rank;
  MEGATRON_CHECK(rank >= 0 && rank < pipeline_size && chunk >= 0 && chunk < virtual_stages,
                 "pipeline rank " << rank << " chunk " << chunk << " is outside " << pipeline_size << " ranks x "
                                  << virtual_stages << " chunks");
  const auto begin = layers_per_stage.begin();
  return {.first_layer = std::accumulate(begin, begin + s, int64_t(0)),
          .num_layers = layers_per_stage[size_t(s)],
          .embedding = s == 0,
          .loss = s == int64_t(layers_per_stage.size()) - 1};
}

namespace {

// --pipeline-model-parallel-layout expanded: sequence := item*, item := ('(' sequence ')' | symbol)
// ('*' count)?, commas and spaces dropped. Throws Error naming the position.
class LayoutExpander {
 public:
  explicit LayoutExpander(std::string_view text) {
    for (char c : text)
      if (c != ',' && !std::isspace(static_cast<unsigned char>(c))) text_ += c;
  }

  std::string expand() {
    std::string out = sequence();
    MEGATRON_CHECK(pos_ == text_.size(), where() << "a ')' without its '('");
    return out;
  }

 private:
  std::string where() const {
    return concat("--pipeline-model-parallel-layout \"", text_, "\" at character ", pos_, ": ");
  }

  std::string sequence() {
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != ')') {
      std::string item;
      const char c = text_[pos_];
      if (c == '(') {
        ++pos_;
        item = sequence();
        MEGATRON_CHECK(pos_ < text_.size(), where() << "a '(' is never closed");
        ++pos_;
      } else {
        MEGATRON_CHECK(c == 'E' || c == 't' || c == 'L' || c == '|',
                       where() << "'" << c
                               << "' is not a layer this build places ('E' embedding, 't' transformer layer, "
                               << "'L' loss, '|' between stages; no MTP layers 'm' yet)");
        item = std::string(1, c);
        ++pos_;
      }
      out += repeated(item);
    }
    return out;
  }

  std::string repeated(const std::string& item) {
    if (pos_ >= text_.size() || text_[pos_] != '*') return item;
    const size_t start = ++pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    MEGATRON_CHECK(pos_ > start && pos_ - start < 7, where() << "'*' needs a count");
    std::string out;
    for (int64_t i = std::stoll(text_.substr(start, pos_ - start)); i > 0; --i) out += item;
    return out;
  }

  std::string text_;
  size_t pos_ = 0;
};

// The layout's layers per virtual stage, checked: 'E' first of stage 0 only, 'L' last of the last
// stage only, L transformer layers, a multiple of P stages.
std::vector<int64_t> layout_stages(const ParallelArgs& a, int64_t num_layers, std::vector<std::string>& errors) {
  const std::string& text = a.pipeline_model_parallel_layout;
  std::string expanded;
  try {
    expanded = LayoutExpander(text).expand();
  } catch (const Error& e) {
    errors.push_back(e.what());
    return {};
  }
  std::vector<std::string> stages{""};
  for (char c : expanded) {
    if (c == '|')
      stages.emplace_back();
    else
      stages.back().push_back(c);
  }
  const int64_t p = a.pipeline_model_parallel_size;
  const auto flag = concat("--pipeline-model-parallel-layout \"", text, "\"");
  if (int64_t(stages.size()) % p != 0)
    errors.push_back(concat(flag, " lists ", stages.size(),
                            " stages, not a multiple of --pipeline-model-parallel-size ", p,
                            ": each rank holds the same number of model chunks; fix: add or merge stages"));
  std::vector<int64_t> counts;
  int64_t layers = 0, embeddings = 0, losses = 0;
  for (const std::string& st : stages) {
    counts.push_back(std::count(st.begin(), st.end(), 't'));
    layers += counts.back();
    embeddings += std::count(st.begin(), st.end(), 'E');
    losses += std::count(st.begin(), st.end(), 'L');
  }
  if (embeddings != 1 || stages.front().front() != 'E')
    errors.push_back(
        concat(flag, ": the embedding 'E' must appear once, first in the first stage; fix: start with \"E\""));
  if (losses != 1 || stages.back().empty() || stages.back().back() != 'L')
    errors.push_back(concat(flag, ": the loss 'L' must appear once, last in the last stage; fix: end with \"L\""));
  if (layers != num_layers)
    errors.push_back(concat(flag, " places ", layers, " transformer layers 't' but --num-layers is ", num_layers,
                            "; fix: place every layer once"));
  return counts;
}

// Layers per pipeline rank without a layout, and the size of the even split (accounted layers
// included; 0 for an uneven split).
std::vector<int64_t> rank_layers(const ParallelArgs& a, int64_t num_layers, std::vector<std::string>& errors) {
  const int64_t p = a.pipeline_model_parallel_size;
  const auto& first = a.decoder_first_pipeline_num_layers;
  const auto& last = a.decoder_last_pipeline_num_layers;
  if (!first && !last) {
    const int64_t n = num_layers + a.account_for_embedding_in_pipeline_split + a.account_for_loss_in_pipeline_split;
    if (n % p == 0) return std::vector<int64_t>(size_t(p), n / p);
    errors.push_back(concat("--num-layers ", num_layers,
                            n != num_layers ? concat(" (", n, " with the embedding/loss counted)") : "",
                            " does not divide over --pipeline-model-parallel-size ", p,
                            "; fix: change one of them, or split unevenly with --decoder-first-pipeline-num-layers / "
                            "--decoder-last-pipeline-num-layers or --pipeline-model-parallel-layout"));
    return {};
  }
  if (a.account_for_embedding_in_pipeline_split || a.account_for_loss_in_pipeline_split) {
    errors.push_back(
        "--decoder-first/last-pipeline-num-layers with --account-for-embedding/loss-in-pipeline-split: "
        "Megatron does not combine an uneven split with counting the embedding or loss as layers; fix: "
        "drop one, or describe the stages with --pipeline-model-parallel-layout");
    return {};
  }
  const int64_t middle_ranks = p - (first ? 1 : 0) - (last ? 1 : 0);
  const int64_t rest = num_layers - first.value_or(0) - last.value_or(0);
  if (middle_ranks < 0 || rest < 0 || (middle_ranks == 0 ? rest != 0 : rest % middle_ranks != 0) ||
      first.value_or(0) < 0 || last.value_or(0) < 0) {
    errors.push_back(concat("--decoder-first-pipeline-num-layers ", first ? concat(*first) : "unset",
                            " and --decoder-last-pipeline-num-layers ", last ? concat(*last) : "unset", " leave ", rest,
                            " of --num-layers ", num_layers, " for ", std::max<int64_t>(middle_ranks, 0),
                            " other pipeline ranks of ", p,
                            ": the rest must divide equally over them; fix: change the first/last stage's layers"));
    return {};
  }
  std::vector<int64_t> per_rank(size_t(p), middle_ranks > 0 ? rest / middle_ranks : 0);
  if (first) per_rank.front() = *first;
  if (last) per_rank.back() = *last;
  return per_rank;
}

int64_t virtual_stages(const ParallelArgs& a, int64_t even_rank_layers, std::vector<std::string>& errors) {
  const auto& per_stage = a.num_layers_per_virtual_pipeline_stage;
  const auto& stages = a.num_virtual_stages_per_pipeline_rank;
  if (per_stage && stages) {
    errors.push_back(
        "--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank both given: "
        "each sets the virtual stages per rank; fix: keep one");
    return 1;
  }
  if (stages) {
    if (*stages >= 1) return *stages;
    errors.push_back(concat("--num-virtual-stages-per-pipeline-rank ", *stages, " must be at least 1"));
    return 1;
  }
  if (!per_stage) return 1;
  if (even_rank_layers > 0 && *per_stage >= 1 && even_rank_layers % *per_stage == 0)
    return even_rank_layers / *per_stage;
  errors.push_back(concat("--num-layers-per-virtual-pipeline-stage ", *per_stage,
                          even_rank_layers > 0
                              ? concat(" does not divide the ", even_rank_layers, " layers of each pipeline rank")
                              : std::string(" needs an even split (no --decoder-first/last-pipeline-num-layers)"),
                          "; fix: use --num-virtual-stages-per-pipeline-rank, or a count that divides"));
  return 1;
}

PipelineSplit resolve(const ParallelArgs& a, int64_t num_layers, std::vector<std::string>& errors) {
  PipelineSplit split;
  const int64_t p = split.pipeline_size = a.pipeline_model_parallel_size;
  if (p < 1 || num_layers < 1) {
    errors.push_back(
        concat("--pipeline-model-parallel-size ", p, " and --num-layers ", num_layers, " must be at least 1"));
    return split;
  }
  if (!a.pipeline_model_parallel_layout.empty()) {
    if (a.decoder_first_pipeline_num_layers || a.decoder_last_pipeline_num_layers ||
        a.account_for_embedding_in_pipeline_split || a.account_for_loss_in_pipeline_split ||
        a.num_layers_per_virtual_pipeline_stage)
      errors.push_back(
          "--pipeline-model-parallel-layout replaces --decoder-first/last-pipeline-num-layers, "
          "--account-for-embedding/loss-in-pipeline-split and --num-layers-per-virtual-pipeline-stage; "
          "fix: drop them");
    split.layers_per_stage = layout_stages(a, num_layers, errors);
    split.virtual_stages = std::max<int64_t>(1, int64_t(split.layers_per_stage.size()) / p);
    const auto& given = a.num_virtual_stages_per_pipeline_rank;
    if (given && *given != split.virtual_stages)
      errors.push_back(concat("--num-virtual-stages-per-pipeline-rank ", *given,
                              " but --pipeline-model-parallel-layout has ", split.virtual_stages,
                              " stages per rank; fix: drop the flag (the layout decides)"));
    return split;
  }
  const std::vector<int64_t> per_rank = rank_layers(a, num_layers, errors);
  const bool even = !a.decoder_first_pipeline_num_layers && !a.decoder_last_pipeline_num_layers;
  const int64_t v = split.virtual_stages = virtual_stages(a, even && !per_rank.empty() ? per_rank.front() : 0, errors);
  if (!errors.empty()) return split;
  split.layers_per_stage.assign(size_t(p * v), 0);
  for (int64_t r = 0; r < p; ++r) {
    if (per_rank[size_t(r)] % v != 0)
      errors.push_back(concat("pipeline rank ", r, "'s ", per_rank[size_t(r)], " layers do not divide into ", v,
                              " model chunks (virtual stages per rank); fix: change the virtual stages or the split"));
    for (int64_t c = 0; c < v; ++c) split.layers_per_stage[size_t(c * p + r)] = per_rank[size_t(r)] / v;
  }
  // The embedding (loss) counted as a layer takes the place of one layer of its stage. Every stage
  // has at least one: the counted total divides into P·V positive shares.
  if (a.account_for_embedding_in_pipeline_split) --split.layers_per_stage.front();
  if (a.account_for_loss_in_pipeline_split) --split.layers_per_stage.back();
  return split;
}

}  // namespace

std::vector<std::string> validate_pipeline_split(const ParallelArgs& args, int64_t num_layers) {
  std::vector<std::string> errors;
  resolve(args, num_layers, errors);
  return errors;
}

PipelineSplit pipeline_split(const ParallelArgs& args, int64_t num_layers) {
  std::vector<std::string> errors;
  PipelineSplit split = resolve(args, num_layers, errors);
  MEGATRON_CHECK(errors.empty(), errors.front());
  return split;
}

}  // namespace megatron::pipeline_parallel
