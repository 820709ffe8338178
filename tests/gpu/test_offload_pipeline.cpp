// The optimizer CPU offload pipeline on the GPU (optimizer/adamw_state.h): gradients copied down and
// parameters copied up on the copy stream while the host updates, in chunks small enough that one
// step runs dozens of them through the two staging slots. With the whole state offloaded every
// update is the CPU AdamW op on the host, so the parameters and moments must equal, bit for bit,
// the same state updated without offload on the CPU backend from the same gradients: a chunk
// updated before its gradients arrived, a slot refilled before its upload finished, or a read of
// the parameters that did not wait for the last upload would show as different values.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "megatron/optimizer/adamw_state.h"

using namespace megatron;
using namespace megatron::test;

namespace {

class OffloadPipeline : public CudaTest {};

// Pieces of uneven sizes with padding between them, as a flat buffer lays out parameters.
struct Layout {
  std::vector<std::pair<int64_t, int64_t>> pieces;
  int64_t numel = 0;
};
Layout uneven_pieces() {
  Layout l;
  for (int64_t i = 0; i < 40; ++i) {
    const int64_t size = 1000 + (i * 7919) % 90000;
    l.pieces.push_back({l.numel, l.numel + size});
    l.numel += size + 16;
  }
  return l;
}

struct Model {
  Tensor params, grads;
  std::unique_ptr<AdamWState> state;
  Model(const Layout& l, Device device, DType params_dtype, const AdamWStateOptions& offload) {
    params = randn({l.numel}, params_dtype, 1).to(device);
    grads = Tensor::zeros({l.numel}, DType::f32, device);
    std::vector<AdamWState::Piece> pieces;
    for (size_t i = 0; i < l.pieces.size(); ++i) {
      const auto [b, e] = l.pieces[i];
      pieces.push_back({b, e, grads.slice(b, e), params.slice(b, e), i % 3 != 0, /*decoupled_lr=*/i % 4 == 1});
    }
    state = std::make_unique<AdamWState>(pieces, l.numel, device, params_dtype, DType::f32, offload);
  }
};

// Elements whose bits differ (a count, not a dump of millions of values).
int64_t differing(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to(Device::cpu()).to_vector(), y = b.to(Device::cpu()).to_vector();
  int64_t n = 0;
  for (size_t i = 0; i < x.size(); ++i) n += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
  return n;
}

}  // namespace

TEST_F(OffloadPipeline, ChunkedCopiesOnTheCopyStreamEqualTheHostUpdateBitForBit) {
  const Layout layout = uneven_pieces();
  for (DType params_dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(params_dtype));
    Model reference(layout, Device::cpu(), params_dtype, {});
    // 64 Ki elements a chunk: about 30 chunks a step, pieces split across chunks and chunks holding several.
    Model offloaded(layout, gpu(), params_dtype,
                    {.cpu_offload = true, .offload_fraction = 1.0, .chunk_elements = 65536});
    for (int64_t t = 1; t <= 3; ++t) {
      const Tensor g = randn({layout.numel}, DType::f32, 100 + uint64_t(t));
      reference.grads.copy_from(g);
      offloaded.grads.copy_from(g);
      const ops::AdamWParams p{.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .grad_scale = 0.7f, .step = t};
      const StepRates rates{1e-3f, 0.1f, 4e-4f};
      reference.state->step(p, rates);
      offloaded.state->step(p, rates);
      // Read on the compute stream, which waits for the last upload without the host waiting.
      EXPECT_EQ(differing(reference.params, offloaded.params), 0) << "parameters after step " << t;
      for (const auto& [b, e] : layout.pieces)
        EXPECT_EQ(differing(reference.state->exp_avg_sq(b, e), offloaded.state->exp_avg_sq(b, e)), 0)
            << "exp_avg_sq of [" << b << ", " << e << ") after step " << t;
    }
  }
}
