// multirank-np: 2
// Imported Hugging Face checkpoints at TP = 2 (tests/hf/tiny/, every family): each rank loads its
// slices (query groups, MLP columns, vocabulary rows) and its columns of the logits match
// transformers' within the single-rank bound (hf/hf_test_util.h), for a checkpoint imported at
// TP = 2 and one imported at TP = 1 and resharded on load, loaded as `megatron train --load CKPT
// --finetune` at TP = 2 loads it (no model flags; the stored vocabulary is HF's rows, whatever
// the TP it was imported at).
#include <algorithm>
#include <memory>

#include "hf/hf_test_util.h"
#include "megatron/hf_bridge/convert.h"
#include "megatron/parallel/parallel_args.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpoint_io.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {
namespace {

TEST(HfTensorParallel, LogitsMatchTransformersAtTp2) {
  std::unique_ptr<TempDir> owner;
  if (make_state({}).ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
  const std::string dir = shared_directory(owner.get());
  const ParallelState st = make_state({.tp = 2}, 60);
  for (const char* family : kHfFamilies) {
    for (int64_t import_tp : {1, 2}) {
      const std::string ckpt = dir + "/" + family + "-tp" + std::to_string(import_tp);
      if (st.ctx.world->rank() == 0)
        hf_bridge::import_hf({.hf_dir = hf_fixture(family), .save = ckpt, .tensor_model_parallel_size = import_tp});
      st.ctx.world->barrier();
      // As `megatron train --load CKPT --finetune` at TP 2 would: model flags from the checkpoint,
      // its architecture (padded vocabulary included) checked on load.
      const TrainingArgs args = parse_training_args(finetune_argv(ckpt, {"--tensor-model-parallel-size", "2"}), 2);
      const ParallelContext ctx = model_context(st.ctx, args.parallel);
      GPTModel model(args.model, ctx);
      ASSERT_TRUE(load_training_checkpoint(args, model, nullptr, nullptr, nullptr));
      const double error = max_logit_error(model, hf_reference(family));
      if (st.ctx.world->rank() == 0)
        std::printf("%s imported at TP %ld, run at TP 2: max |logit - transformers| = %.3g\n", family, long(import_tp),
                    error);
      EXPECT_LE(error, kLogitTolerance) << family << " imported at TP " << import_tp;
    }
  }
  st.ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
