#include "megatron/parallel/text_collectives.h"

#include <cstring>
#include <limits>

#include "megatron/core/error.h"

namespace megatron {

namespace {

Tensor bytes_on(const std::string& text, Device device) {
  Tensor host = Tensor::empty({int64_t(text.size())}, DType::u8);
  if (!text.empty()) std::memcpy(host.raw(), text.data(), text.size());
  return host.to(device);
}

Tensor count_on(size_t count, Device device) {
  Tensor host = Tensor::empty({1}, DType::i64);
  host.data<int64_t>()[0] = int64_t(count);
  return host.to(device);
}

std::string text_of(const Tensor& bytes) {
  const Tensor host = bytes.to(Device::cpu());
  return std::string(static_cast<const char*>(host.raw()), size_t(host.numel()));
}

}  // namespace

std::string broadcast_text(Communicator& comm, const std::string& text, int root, Device device) {
  const bool is_root = comm.rank() == root;
  Tensor length = count_on(is_root ? text.size() : 0, device);
  comm.broadcast(length, root);
  const int64_t n = int64_t(length.item(0));
  if (n == 0) return {};
  Tensor bytes = is_root ? bytes_on(text, device) : Tensor::empty({n}, DType::u8, device);
  comm.broadcast(bytes, root);
  return is_root ? text : text_of(bytes);
}

std::vector<std::string> gather_text(Communicator& comm, const std::string& text, int root, Device device) {
  const int ranks = comm.size();
  const bool is_root = comm.rank() == root;
  Tensor lengths = Tensor::empty({int64_t(ranks)}, DType::i64, device);
  comm.all_gather(lengths, count_on(text.size(), device));
  std::vector<int64_t> send(size_t(ranks), 0), recv(size_t(ranks), 0);
  send[size_t(root)] = int64_t(text.size());
  int64_t total = 0;
  if (is_root)
    for (int r = 0; r < ranks; ++r) total += recv[size_t(r)] = int64_t(lengths.item(r));
  // MPI counts are ints: control messages stay far below this.
  MEGATRON_CHECK(total <= std::numeric_limits<int>::max(),
                 "gather_text: " << total << " bytes to rank " << root << " exceed 2^31-1; the messages must be short");
  Tensor out = Tensor::empty({total}, DType::u8, device);
  comm.all_to_all_v(out, recv, bytes_on(text, device), send);
  std::vector<std::string> texts;
  if (!is_root) return texts;
  const std::string all = text_of(out);
  int64_t at = 0;
  for (int r = 0; r < ranks; ++r) {
    texts.push_back(all.substr(size_t(at), size_t(recv[size_t(r)])));
    at += recv[size_t(r)];
  }
  return texts;
}

}  // namespace megatron
