#pragma once
// Collective communication over one process group. Models and parallel layers call this
// interface only, never NCCL or MPI. Implementations: single-rank (here), MPI for CPU ranks and
// NCCL for GPUs (distributed runtime issue). Calls are in place unless stated; a group of size 1
// makes every collective an identity, so TP=1/DP=1 code runs the same path as the parallel one.
#include <memory>
#include <string>

#include "megatron/core/tensor.h"

namespace megatron {

enum class ReduceOp { sum, max, min };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "tp", "dp", ... for error messages and the watchdog
  virtual void all_reduce(Tensor& tensor, ReduceOp op) = 0;
  // out holds size() * in.numel() elements: rank r's input lands at rows [r*n, (r+1)*n).
  virtual void all_gather(Tensor& out, const Tensor& in) = 0;
  // in holds size() * out.numel() elements; out = the sum of every rank's r-th chunk.
  virtual void reduce_scatter(Tensor& out, const Tensor& in) = 0;
  virtual void broadcast(Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;
};

// The group of one process.
class SingleRankCommunicator final : public Communicator {
 public:
  explicit SingleRankCommunicator(std::string group_name) : name_(std::move(group_name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
  void all_reduce(Tensor&, ReduceOp) override {}
  void all_gather(Tensor& out, const Tensor& in) override { copy_if_distinct(out, in); }
  void reduce_scatter(Tensor& out, const Tensor& in) override { copy_if_distinct(out, in); }
  void broadcast(Tensor&, int) override {}
  void barrier() override {}

 private:
  static void copy_if_distinct(Tensor& out, const Tensor& in) {
    if (out.raw() != in.raw()) out.copy_from(in);
  }
  std::string name_;
};

// The groups one rank belongs to, passed explicitly to layers (no process-group globals).
struct ParallelContext {
  std::shared_ptr<Communicator> world;
  std::shared_ptr<Communicator> tp;  // tensor (and sequence) parallel
  std::shared_ptr<Communicator> dp;  // data parallel
  std::shared_ptr<Communicator> pp;  // pipeline
  int tp_rank() const { return tp->rank(); }
  int tp_size() const { return tp->size(); }

  static ParallelContext single_process();
};

inline ParallelContext ParallelContext::single_process() {
  return {std::make_shared<SingleRankCommunicator>("world"), std::make_shared<SingleRankCommunicator>("tp"),
          std::make_shared<SingleRankCommunicator>("dp"), std::make_shared<SingleRankCommunicator>("pp")};
}

}  // namespace megatron
