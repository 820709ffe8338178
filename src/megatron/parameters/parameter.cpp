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

int64_t Parameter::global_coordinate(size_t dim, int64_t local_coord) const {
  int64_t coord = dim == 0 ? local_coord + expert_offset() : local_coord;
  if (spec.partition_dim != int(dim) || tp_size == 1) return coord;
  // Block b of this rank's rows sits at block b of the global rows, at this rank's place in it.
  const int64_t local_block = local_shape[dim] / spec.partition_blocks;
  const int64_t global_block = spec.global_shape[dim] / spec.partition_blocks;
  return (coord / local_block) * global_block + tp_rank * local_block + coord % local_block;
}

int64_t Parameter::global_index(int64_t local_index) const {
  if (!spec.expert_parallel && (spec.partition_dim < 0 || tp_size == 1)) return local_index;
  // The local element's row-major coordinates, each mapped to the global tensor, recomposed.
  int64_t rest = local_index, global = 0, stride = 1;
  for (size_t d = local_shape.size(); d-- > 0;) {
    global += global_coordinate(d, rest % local_shape[d]) * stride;
    rest /= local_shape[d];
    stride *= spec.global_shape[d];
  }
  return global;
}

int64_t Parameter::contiguous_runs() const {
  if (spec.partition_dim < 0 || tp_size == 1 || spec.partition_blocks == 1) return 1;
  int64_t outer = 1;
  for (size_t d = 0; d < size_t(spec.partition_dim); ++d) outer *= local_shape[d];
  return outer * spec.partition_blocks;
}

std::vector<Parameter::Slice> Parameter::global_slices_of(const Tensor& local) const {
  check_shape(local, local_shape, spec.name.c_str());
  const int64_t runs = contiguous_runs();
  const Tensor rows = local.view({runs, -1});
  std::vector<Slice> slices;
  for (int64_t k = 0; k < runs; ++k) {
    // Run k: the local coordinates of its first element, and its extent (1 in the dimensions
    // before the partition dimension when there are several runs).
    Shape first(local_shape.size(), 0), extent = local_shape;
    if (runs > 1) {
      const auto d = size_t(spec.partition_dim);
      const int64_t local_block = local_shape[d] / spec.partition_blocks;
      first[d] = (k % spec.partition_blocks) * local_block;
      extent[d] = local_block;
      for (int64_t outer = k / spec.partition_blocks, i = int64_t(d) - 1; i >= 0; --i) {
        first[size_t(i)] = outer % local_shape[size_t(i)];
        extent[size_t(i)] = 1;
        outer /= local_shape[size_t(i)];
      }
    }
    for (size_t d = 0; d < first.size(); ++d) first[d] = global_coordinate(d, first[d]);
    slices.push_back({std::move(first), runs > 1 ? rows.select(k).view(extent) : local});
  }
  return slices;
}

std::vector<Parameter::FlatBox> Parameter::global_boxes(int64_t begin, int64_t end) const {
  const int64_t n = shape_numel(local_shape);
  MEGATRON_CHECK(0 <= begin && begin <= end && end <= n,
                 spec.name << ": flat range [" << begin << ", " << end << ") lies outside its " << n << " elements");
  MEGATRON_CHECK(!local_shape.empty(), spec.name << ": a scalar parameter has no boxes; register it with shape [1]");
  // Cut at the runs' edges: a box inside one run maps to the global tensor coordinate by
  // coordinate (blocks split along a dimension land in separate places of the global tensor).
  const int64_t runs = contiguous_runs(), run = n / runs;
  std::vector<FlatBox> out;
  for (int64_t k = begin / std::max<int64_t>(run, 1); k < runs && k * run < end; ++k) {
    const int64_t lo = std::max(begin, k * run), hi = std::min(end, (k + 1) * run);
    std::vector<Box> boxes;
    Shape prefix;
    append_boxes(local_shape, 0, lo, hi, prefix, boxes);
    int64_t flat = lo;
    for (Box& box : boxes) {
      for (size_t d = 0; d < box.offset.size(); ++d) box.offset[d] = global_coordinate(d, box.offset[d]);
      const int64_t size = shape_numel(box.shape);
      out.push_back({flat, std::move(box.offset), std::move(box.shape)});
      flat += size;
    }
  }
  return out;
}

}  // namespace megatron
