#include "megatron/transformer/moe/alltoall_exchange.h"

#include <numeric>

#include "megatron/core/error.h"
#include "megatron/ops/moe_permute.h"

namespace megatron::moe {

AllToAllExchange plan_exchange(const std::vector<int64_t>& tokens_per_expert, int64_t num_local_experts,
                               Communicator& ep, Device device) {
  const auto E = int64_t(tokens_per_expert.size()), L = num_local_experts;
  const int ranks = ep.size(), me = ep.rank();
  MEGATRON_CHECK(L * ranks == E, "the all-to-all dispatcher: " << E << " experts are not " << ranks << " EP ranks x "
                                                               << L << " local experts");
  // counts[s*E + e]: the rows rank s sends expert e (f64: exact for any count of rows).
  Tensor mine = Tensor::empty({E}, DType::f64);
  for (int64_t e = 0; e < E; ++e) mine.set_item(e, double(tokens_per_expert[size_t(e)]));
  Tensor all = Tensor::empty({ranks * E}, DType::f64, device);
  ep.all_gather(all, mine.to(device));
  const Tensor counts = all.to(Device::cpu());
  const auto count = [&](int64_t s, int64_t e) { return int64_t(counts.item(s * E + e)); };

  AllToAllExchange x;
  x.send_rows.assign(size_t(ranks), 0);
  x.recv_rows.assign(size_t(ranks), 0);
  x.tokens_per_local_expert.assign(size_t(L), 0);
  for (int r = 0; r < ranks; ++r)
    for (int64_t j = 0; j < L; ++j) {
      x.send_rows[size_t(r)] += tokens_per_expert[size_t(r * L + j)];
      x.recv_rows[size_t(r)] += count(r, me * L + j);
      x.tokens_per_local_expert[size_t(j)] += count(r, me * L + j);
    }
  // Received: rank s's rows in its expert order; sorted: expert j's rows from rank 0, 1, ...
  std::vector<int64_t> arrival_start(size_t(ranks), 0);  // first received row of rank s
  std::exclusive_scan(x.recv_rows.begin(), x.recv_rows.end(), arrival_start.begin(), int64_t(0));
  const int64_t M = std::accumulate(x.recv_rows.begin(), x.recv_rows.end(), int64_t(0));
  Tensor expert_order = Tensor::empty({M}, DType::i32), arrival_order = Tensor::empty({M}, DType::i32);
  int32_t* to_arrival = expert_order.data<int32_t>();
  int32_t* to_expert = arrival_order.data<int32_t>();
  int64_t next = 0;
  for (int64_t j = 0; j < L; ++j)
    for (int s = 0; s < ranks; ++s) {
      int64_t at = arrival_start[size_t(s)];  // rank s's rows of expert j follow its earlier experts'
      for (int64_t jj = 0; jj < j; ++jj) at += count(s, me * L + jj);
      for (int64_t k = 0; k < count(s, me * L + j); ++k, ++next) {
        to_arrival[next] = int32_t(at + k);
        to_expert[at + k] = int32_t(next);
      }
    }
  x.expert_order = expert_order.to(device);
  x.arrival_order = arrival_order.to(device);
  return x;
}

Tensor to_experts(const Tensor& rows, const AllToAllExchange& x, Communicator& ep) {
  Tensor arrived = Tensor::empty({x.expert_order.numel(), rows.dim(1)}, rows.dtype(), rows.device());
  ep.all_to_all_v(arrived, x.recv_rows, rows, x.send_rows);
  Tensor sorted = Tensor::empty(arrived.shape(), rows.dtype(), rows.device());
  ops::moe_permute(sorted, arrived, x.expert_order, Tensor());
  return sorted;
}

Tensor from_experts(const Tensor& expert_rows, const AllToAllExchange& x, Communicator& ep) {
  Tensor leaving = Tensor::empty(expert_rows.shape(), expert_rows.dtype(), expert_rows.device());
  ops::moe_permute(leaving, expert_rows, x.arrival_order, Tensor());
  const int64_t N = std::accumulate(x.send_rows.begin(), x.send_rows.end(), int64_t(0));
  Tensor rows = Tensor::empty({N, expert_rows.dim(1)}, expert_rows.dtype(), expert_rows.device());
  ep.all_to_all_v(rows, x.send_rows, leaving, x.recv_rows);
  return rows;
}

}  // namespace megatron::moe
