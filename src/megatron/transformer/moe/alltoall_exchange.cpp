#include "megatron/transformer/moe/alltoall_exchange.h"

#include <numeric>

#include "megatron/core/error.h"
#include "megatron/ops/moe_permute.h"

namespace megatron::moe {

AllToAllExchange plan_exchange(const std::vector<int64_t>& tokens_per_expert, int64_t num_local_experts,
                               Communicator& group, Device device) {
  const auto E = int64_t(tokens_per_expert.size()), L = num_local_experts;
  const int ranks = group.size(), me = group.rank();
  MEGATRON_CHECK(L > 0 && E % L == 0 && ranks % (E / L) == 0,
                 "the all-to-all dispatcher: " << E << " experts of " << L << " per EP rank do not tile a group of "
                                               << ranks << " ranks (expert TP x EP)");
  const int64_t etp = ranks / (E / L);
  const auto ep_of = [etp](int64_t g) { return g / etp; };
  const int64_t mine_first = ep_of(me) * L;  // this rank's first expert
  // counts[s*E + e]: the rows rank s sends expert e (f64: exact for any count of rows).
  Tensor mine = Tensor::empty({E}, DType::f64);
  for (int64_t e = 0; e < E; ++e) mine.set_item(e, double(tokens_per_expert[size_t(e)]));
  Tensor all = Tensor::empty({ranks * E}, DType::f64, device);
  group.all_gather(all, mine.to(device));
  const Tensor counts = all.to(Device::cpu());
  const auto count = [&](int64_t s, int64_t e) { return int64_t(counts.item(s * E + e)); };

  AllToAllExchange x;
  x.send_rows.assign(size_t(ranks), 0);
  x.recv_rows.assign(size_t(ranks), 0);
  x.tokens_per_local_expert.assign(size_t(L), 0);
  for (int g = 0; g < ranks; ++g)
    for (int64_t j = 0; j < L; ++j) {
      x.send_rows[size_t(g)] += tokens_per_expert[size_t(ep_of(g) * L + j)];
      x.recv_rows[size_t(g)] += count(g, mine_first + j);
      x.tokens_per_local_expert[size_t(j)] += count(g, mine_first + j);
    }
  if (etp > 1) {
    // Each EP rank's rows go to each of its ETP ranks: copy them in send order, and remember
    // where each local row's copies come back.
    std::vector<int64_t> ep_start(size_t(E / L) + 1, 0);  // first local row of each EP rank's experts
    for (int64_t r = 0; r < E / L; ++r)
      ep_start[size_t(r + 1)] =
          ep_start[size_t(r)] + std::accumulate(tokens_per_expert.begin() + r * L,
                                                tokens_per_expert.begin() + (r + 1) * L, int64_t(0));
    const int64_t N = ep_start.back();
    Tensor send_order = Tensor::empty({etp * N}, DType::i32), copies = Tensor::empty({N, etp}, DType::i32);
    int32_t* from = send_order.data<int32_t>();
    int32_t* back = copies.data<int32_t>();
    int64_t sent = 0;
    for (int g = 0; g < ranks; ++g)
      for (int64_t i = ep_start[size_t(ep_of(g))]; i < ep_start[size_t(ep_of(g) + 1)]; ++i, ++sent) {
        from[sent] = int32_t(i);
        back[i * etp + g % etp] = int32_t(sent);
      }
    x.send_order = send_order.to(device);
    x.copies = copies.to(device);
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
      for (int64_t jj = 0; jj < j; ++jj) at += count(s, mine_first + jj);
      for (int64_t k = 0; k < count(s, mine_first + j); ++k, ++next) {
        to_arrival[next] = int32_t(at + k);
        to_expert[at + k] = int32_t(next);
      }
    }
  x.expert_order = expert_order.to(device);
  x.arrival_order = arrival_order.to(device);
  return x;
}

Tensor to_experts(const Tensor& rows, const AllToAllExchange& x, Communicator& group) {
  Tensor sending = rows;
  if (x.send_order.defined()) {
    sending = Tensor::empty({x.send_order.numel(), rows.dim(1)}, rows.dtype(), rows.device());
    ops::moe_permute(sending, rows, x.send_order, Tensor());
  }
  Tensor arrived = Tensor::empty({x.expert_order.numel(), rows.dim(1)}, rows.dtype(), rows.device());
  group.all_to_all_v(arrived, x.recv_rows, sending, x.send_rows);
  Tensor sorted = Tensor::empty(arrived.shape(), rows.dtype(), rows.device());
  ops::moe_permute(sorted, arrived, x.expert_order, Tensor());
  return sorted;
}

Tensor from_experts(const Tensor& expert_rows, const AllToAllExchange& x, Communicator& group) {
  Tensor leaving = Tensor::empty(expert_rows.shape(), expert_rows.dtype(), expert_rows.device());
  ops::moe_permute(leaving, expert_rows, x.arrival_order, Tensor());
  const int64_t returned_rows = std::accumulate(x.send_rows.begin(), x.send_rows.end(), int64_t(0));
  Tensor returned = Tensor::empty({returned_rows, expert_rows.dim(1)}, expert_rows.dtype(), expert_rows.device());
  group.all_to_all_v(returned, x.send_rows, leaving, x.recv_rows);
  if (!x.copies.defined()) return returned;
  Tensor rows = Tensor::empty({x.copies.dim(0), expert_rows.dim(1)}, expert_rows.dtype(), expert_rows.device());
  ops::moe_unpermute(rows, returned, x.copies, Tensor());
  return rows;
}

}  // namespace megatron::moe
