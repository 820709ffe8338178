#include "megatron/parameters/parameter.h"

#include <algorithm>

namespace megatron {

namespace {
struct Box {
  Shape offset, shape;
};

// Appends boxes that cover the flat range [begin, end) of the row-major dimensions shape[dim:],
// in flat order; `prefix` holds the coordinates of the dimensions before dim. Each box has
// extent 1 in the leading dimensions, then one partial dimension, then full dimensions, so it is
// contiguous in memory: at most a partial first row, whole rows, and a partial last row.
void append_boxes(const Shape& shape, size_t dim, int64_t begin, int64_t end, Shape& prefix, std::vector<Box>& out) {
  if (begin >= end) return;
  int64_t inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  int64_t row = begin / inner;
  const auto partial_row = [&](int64_t lo, int64_t hi) {
    prefix.push_back(row);
    append_boxes(shape, dim + 1, lo - row * inner, hi - row * inner, prefix, out);
    prefix.pop_back();
  };
  if (begin % inner != 0) {
    const int64_t stop = std::min(end, (row + 1) * inner);
    partial_row(begin, stop);
    begin = stop;
    ++row;
  }
  if (const int64_t rows = (end - begin) / inner; rows > 0) {
    Box box{prefix, Shape(dim, 1)};
    box.offset.push_back(row);
    box.offset.resize(shape.size(), 0);
    box.shape.push_back(rows);
    box.shape.insert(box.shape.end(), shape.begin() + int64_t(dim) + 1, shape.end());
    out.push_back(std::move(box));
    begin += rows * inner;
    row += rows;
  }
  if (begin < end) partial_row(begin, end);
}
}  // namespace

Shape tp_local_shape(const ParamSpec& spec, int tp_size) {
  Shape local = spec.global_shape;
  if (spec.partition_dim < 0) return local;
  MEGATRON_CHECK(spec.partition_dim < int(local.size()), spec.name << ": partition_dim out of range");
  const int64_t global = local[size_t(spec.partition_dim)];
  const int64_t divisor = spec.partition_blocks * tp_size;
  MEGATRON_CHECK(global % divisor == 0, spec.name << ": dimension " << spec.partition_dim << " of size " << global
                                                  << " is not divisible by " << spec.partition_blocks
                                                  << " block(s) x TP " << tp_size);
  local[size_t(spec.partition_dim)] = global / tp_size;
  return local;
}

int64_t Parameter::global_index(int64_t local_index) const {
  // Expert-parallel shards are whole rows of dim 0 (no TP split with them): shift by the rows
  // of the experts before this rank's.
  if (spec.expert_parallel) return local_index + expert_offset() * (shape_numel(local_shape) / local_shape[0]);
  if (spec.partition_dim < 0 || tp_size == 1) return local_index;
  const int d = spec.partition_dim;
  // Strides of the local and global tensors (row-major).
  int64_t inner = 1;
  for (size_t i = size_t(d) + 1; i < local_shape.size(); ++i) inner *= local_shape[i];
  const int64_t local_d = local_shape[size_t(d)];
  const int64_t global_d = spec.global_shape[size_t(d)];
  const int64_t outer_index = local_index / (inner * local_d);
  const int64_t coord = (local_index / inner) % local_d;
  const int64_t within = local_index % inner;
  const int64_t local_block = local_d / spec.partition_blocks;
  const int64_t global_block = global_d / spec.partition_blocks;
  const int64_t global_coord = (coord / local_block) * global_block + tp_rank * local_block + coord % local_block;
  return (outer_index * global_d + global_coord) * inner + within;
}

std::vector<Parameter::Slice> Parameter::global_slices_of(const Tensor& local) const {
  check_shape(local, local_shape, spec.name.c_str());
  Shape offset(spec.global_shape.size(), 0);
  if (spec.expert_parallel) offset[0] = expert_offset();
  if (spec.partition_dim < 0 || tp_size == 1) return {{offset, local}};
  const int d = spec.partition_dim;
  const int64_t local_block = local_shape[size_t(d)] / spec.partition_blocks;
  const int64_t global_block = spec.global_shape[size_t(d)] / spec.partition_blocks;
  if (spec.partition_blocks == 1) {
    offset[size_t(d)] = tp_rank * local_block;
    return {{offset, local}};
  }
  MEGATRON_CHECK(d == 0, spec.name << ": blocked partitions are only supported along dim 0");
  std::vector<Slice> slices;
  for (int64_t b = 0; b < spec.partition_blocks; ++b) {
    offset[0] = b * global_block + tp_rank * local_block;
    slices.push_back({offset, local.slice(b * local_block, (b + 1) * local_block)});
  }
  return slices;
}

std::vector<Parameter::FlatBox> Parameter::global_boxes(int64_t begin, int64_t end) const {
  const int64_t n = shape_numel(local_shape);
  MEGATRON_CHECK(0 <= begin && begin <= end && end <= n,
                 spec.name << ": flat range [" << begin << ", " << end << ") lies outside its " << n << " elements");
  MEGATRON_CHECK(!local_shape.empty(), spec.name << ": a scalar parameter has no boxes; register it with shape [1]");
  const bool split = spec.partition_dim >= 0 && tp_size > 1;
  const size_t d = size_t(std::max(spec.partition_dim, 0));
  const int64_t local_block = local_shape[d] / spec.partition_blocks;
  const int64_t global_block = spec.global_shape[d] / spec.partition_blocks;
  // Blocks split along dim 0 land in separate places of the global tensor: cut at block edges.
  const int64_t pieces = split ? spec.partition_blocks : 1;
  MEGATRON_CHECK(pieces == 1 || d == 0, spec.name << ": blocked partitions are only supported along dim 0");
  std::vector<FlatBox> out;
  for (int64_t k = 0; k < pieces; ++k) {
    const int64_t lo = std::max(begin, k * n / pieces), hi = std::min(end, (k + 1) * n / pieces);
    std::vector<Box> boxes;
    Shape prefix;
    append_boxes(local_shape, 0, lo, hi, prefix, boxes);
    int64_t flat = lo;
    for (Box& box : boxes) {
      if (split) {
        const int64_t c = box.offset[d];
        box.offset[d] = (c / local_block) * global_block + tp_rank * local_block + c % local_block;
      }
      box.offset[0] += expert_offset();
      const int64_t size = shape_numel(box.shape);
      out.push_back({flat, std::move(box.offset), std::move(box.shape)});
      flat += size;
    }
  }
  return out;
}

}  // namespace megatron
