#include "megatron/training/shard_gather.h"

#include <algorithm>
#include <cstring>

namespace megatron {

namespace {
using checkpointing::ShardedTensor;

// One rank's shards without their data: i64 words (count, then per shard: dtype, number of dimensions, global
// shape, global offset, local shape, name length) and the names' bytes, concatenated.
struct Header {
  std::vector<int64_t> words;
  std::string names;
};

Header encode(const std::vector<ShardedTensor>& shards) {
  Header h;
  h.words.push_back(int64_t(shards.size()));
  for (const ShardedTensor& s : shards) {
    const Shape& local = s.local.shape();
    h.words.push_back(int64_t(s.local.dtype()));
    h.words.push_back(int64_t(local.size()));
    for (const Shape* v : {&s.global_shape, &s.global_offset, &local})
      h.words.insert(h.words.end(), v->begin(), v->end());
    h.words.push_back(int64_t(s.name.size()));
    h.names += s.name;
  }
  return h;
}

// The shards a header describes, with empty host tensors of their local shapes.
std::vector<ShardedTensor> decode(const std::vector<int64_t>& words, const std::string& names, int rank) {
  size_t w = 0, n = 0;
  const auto next = [&] {
    MEGATRON_CHECK(w < words.size(), "checkpoint shard header of rank " << rank << " is truncated");
    return words[w++];
  };
  const auto shape = [&](int64_t ndim) {
    Shape s(static_cast<size_t>(ndim));
    for (int64_t& d : s) d = next();
    return s;
  };
  std::vector<ShardedTensor> out(static_cast<size_t>(next()));
  for (ShardedTensor& s : out) {
    const DType dtype = DType(next());
    const int64_t dims = next();
    s.global_shape = shape(dims);
    s.global_offset = shape(dims);
    const Shape local = shape(dims);
    const size_t length = size_t(next());
    MEGATRON_CHECK(n + length <= names.size(), "checkpoint shard names of rank " << rank << " are truncated");
    s.name = names.substr(n, length);
    n += length;
    s.local = Tensor::empty(local, dtype);
  }
  return out;
}

Tensor host_tensor(const void* data, int64_t count, DType dtype) {
  Tensor t = Tensor::empty({count}, dtype);
  if (count > 0) std::memcpy(t.raw(), data, size_t(count) * dtype_size(dtype));
  return t;
}

// Sends each rank's 1-D host tensor (rank r's holds counts[r] elements, known everywhere) to the
// root, which returns them concatenated in rank order (an empty tensor elsewhere). A collective
// over the whole group (all-to-all with nothing sent but to the root), so a rank that never
// arrives is named by the watchdog like in any collective; rounds of at most 2^30 elements per
// rank keep MPI's int counts.
Tensor to_root(Communicator& comm, const Tensor& mine, const std::vector<int64_t>& counts, int root, Device device) {
  constexpr int64_t kRound = int64_t(1) << 30;
  const size_t R = counts.size();
  const bool is_root = comm.rank() == root;
  std::vector<int64_t> offsets(R + 1, 0);
  int64_t rounds = 0;
  for (size_t r = 0; r < R; ++r) {
    offsets[r + 1] = offsets[r] + counts[r];
    rounds = std::max(rounds, (counts[r] + kRound - 1) / kRound);
  }
  Tensor all = Tensor::empty({is_root ? offsets[R] : 0}, mine.dtype());
  for (int64_t k = 0; k < rounds; ++k) {
    const auto in_round = [&](size_t r) { return std::clamp(counts[r] - k * kRound, int64_t(0), kRound); };
    std::vector<int64_t> send_rows(R, 0), recv_rows(R, 0);
    const int64_t n = in_round(size_t(comm.rank()));
    send_rows[size_t(root)] = n;
    int64_t received = 0;
    if (is_root)
      for (size_t r = 0; r < R; ++r) received += recv_rows[r] = in_round(r);
    const Tensor in = mine.slice(k * kRound, k * kRound + n).to(device);
    Tensor out = Tensor::empty({received}, mine.dtype(), device);
    comm.all_to_all_v(out, recv_rows, in, send_rows);
    if (!is_root) continue;
    const Tensor arrived = out.to(Device::cpu());
    int64_t at = 0;
    for (size_t r = 0; r < R; ++r) {
      Tensor dest = all.slice(offsets[r] + k * kRound, offsets[r] + k * kRound + recv_rows[r]);
      dest.copy_from(arrived.slice(at, at + recv_rows[r]));
      at += recv_rows[r];
    }
  }
  return all;
}
}  // namespace

std::vector<ShardedTensor> gather_shards(Communicator& comm, const std::vector<ShardedTensor>& mine, int root,
                                         Device device) {
  std::vector<ShardedTensor> out;
  if (comm.rank() == root)
    for (const ShardedTensor& s : mine)
      out.push_back({s.name, s.global_shape, s.global_offset, s.local.to(Device::cpu())});
  if (comm.size() == 1) return out;

  // This rank's header and its tensors' bytes, packed on the host.
  const Header header = encode(mine);
  std::vector<uint8_t> bytes;
  for (const ShardedTensor& s : mine) {
    const Tensor host = s.local.to(Device::cpu());
    const auto* p = static_cast<const uint8_t*>(host.raw());
    bytes.insert(bytes.end(), p, p + host.nbytes());
  }
  const int64_t my_sizes[3] = {int64_t(header.words.size()), int64_t(header.names.size()), int64_t(bytes.size())};
  Tensor sizes = Tensor::empty({3 * comm.size()}, DType::i64, device);
  comm.all_gather(sizes, host_tensor(my_sizes, 3, DType::i64).to(device));
  const Tensor all_sizes = sizes.to(Device::cpu());
  std::vector<std::vector<int64_t>> counts(3, std::vector<int64_t>(size_t(comm.size())));
  for (int r = 0; r < comm.size(); ++r)
    for (size_t k = 0; k < 3; ++k) counts[k][size_t(r)] = all_sizes.data<int64_t>()[3 * r + int64_t(k)];

  const Tensor words =
      to_root(comm, host_tensor(header.words.data(), my_sizes[0], DType::i64), counts[0], root, device);
  const Tensor names = to_root(comm, host_tensor(header.names.data(), my_sizes[1], DType::u8), counts[1], root, device);
  const Tensor data = to_root(comm, host_tensor(bytes.data(), my_sizes[2], DType::u8), counts[2], root, device);
  if (comm.rank() != root) return out;

  int64_t word_at = 0, name_at = 0, byte_at = 0;
  for (int r = 0; r < comm.size(); ++r) {
    const size_t rr = size_t(r);
    if (r != root) {
      const int64_t* w = words.data<int64_t>() + word_at;
      const char* n = static_cast<const char*>(names.raw()) + name_at;
      std::vector<ShardedTensor> theirs =
          decode(std::vector<int64_t>(w, w + counts[0][rr]), std::string(n, size_t(counts[1][rr])), r);
      int64_t at = byte_at;
      for (ShardedTensor& s : theirs) {
        MEGATRON_CHECK(at + int64_t(s.local.nbytes()) <= byte_at + counts[2][rr],
                       "checkpoint shards of rank " << r << " hold fewer bytes than their header describes");
        if (s.local.nbytes() > 0)
          std::memcpy(s.local.raw(), static_cast<const uint8_t*>(data.raw()) + at, s.local.nbytes());
        at += int64_t(s.local.nbytes());
        out.push_back(std::move(s));
      }
    }
    word_at += counts[0][rr];
    name_at += counts[1][rr];
    byte_at += counts[2][rr];
  }
  return out;
}

}  // namespace megatron
