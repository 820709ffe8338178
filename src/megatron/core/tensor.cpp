#include "megatron/core/tensor.h"

#include <cstring>
#include <sstream>

#include "megatron/core/memory.h"

namespace megatron {

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    MEGATRON_CHECK(d >= 0, "negative dimension in shape " << shape_str(shape));
    n *= d;
  }
  return n;
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

Storage::~Storage() {
  if (release != nullptr && data != nullptr) release(data, bytes, device);
}

Tensor Tensor::released(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  auto storage = std::make_shared<Storage>();
  storage->bytes = t.nbytes();
  storage->device = device;
  storage->release = allocator_for(device).release;
  storage->memory_released = true;
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t = released(shape, dtype, device);
  t.reacquire_memory();
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero();
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  auto storage = std::make_shared<Storage>();
  storage->data = data;
  storage->bytes = t.nbytes();
  storage->device = device;
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, DType dtype) {
  MEGATRON_CHECK(int64_t(values.size()) == shape_numel(shape), values.size()
                                                                   << " values do not fill shape " << shape_str(shape));
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i) t.set_item(int64_t(i), values[i]);
  return t;
}

Device Tensor::device() const { return storage_ ? storage_->device : Device::cpu(); }

int64_t Tensor::dim(int i) const {
  const int n = ndim();
  const int k = i < 0 ? i + n : i;
  MEGATRON_CHECK(k >= 0 && k < n, "dimension " << i << " out of range for shape " << shape_str(shape_));
  return shape_[size_t(k)];
}

void* Tensor::raw() {
  MEGATRON_CHECK(defined(), "access to an undefined tensor");
  MEGATRON_CHECK(!storage_->memory_released, "access to a tensor whose memory was released (Tensor::release_memory)");
  return static_cast<char*>(storage_->data) + offset_;
}
const void* Tensor::raw() const {
  MEGATRON_CHECK(defined(), "access to an undefined tensor");
  MEGATRON_CHECK(!storage_->memory_released, "access to a tensor whose memory was released (Tensor::release_memory)");
  return static_cast<const char*>(storage_->data) + offset_;
}

void Tensor::release_memory() {
  MEGATRON_CHECK(defined() && offset_ == 0 && nbytes() == storage_->bytes && storage_->release != nullptr,
                 "release_memory() on a view or on memory owned elsewhere; call it on the tensor Tensor::empty made");
  if (storage_->memory_released) return;
  if (storage_->data != nullptr) storage_->release(storage_->data, storage_->bytes, storage_->device);
  storage_->data = nullptr;
  storage_->memory_released = true;
}

void Tensor::reacquire_memory() {
  MEGATRON_CHECK(defined() && offset_ == 0 && nbytes() == storage_->bytes && storage_->release != nullptr,
                 "reacquire_memory() on a view or on memory owned elsewhere; call it on the tensor Tensor::empty made");
  if (!storage_->memory_released) return;
  storage_->data = allocator_for(storage_->device).allocate(storage_->bytes, storage_->device);
  storage_->memory_released = false;
}

void Tensor::check_type(DType requested) const {
  MEGATRON_CHECK(requested == dtype_,
                 "tensor holds " << dtype_name(dtype_) << " but was read as " << dtype_name(requested));
}

Tensor Tensor::view(const Shape& shape) const {
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MEGATRON_CHECK(infer < 0, "view shape " << shape_str(shape) << " has more than one -1");
      infer = int(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    MEGATRON_CHECK(known > 0 && numel_ % known == 0, "cannot view " << shape_str(shape_) << " as " << shape_str(shape));
    s[size_t(infer)] = numel_ / known;
  }
  MEGATRON_CHECK(shape_numel(s) == numel_,
                 "cannot view " << shape_str(shape_) << " (" << numel_ << " elements) as " << shape_str(s));
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  MEGATRON_CHECK(ndim() >= 1, "slice of a 0-d tensor");
  MEGATRON_CHECK(0 <= begin && begin <= end && end <= shape_[0],
                 "slice [" << begin << ", " << end << ") out of range for shape " << shape_str(shape_));
  Tensor t = *this;
  const int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  t.offset_ += size_t(begin * row) * element_size();
  t.shape_[0] = end - begin;
  t.numel_ = row * (end - begin);
  return t;
}

Tensor Tensor::select(int64_t index) const {
  Tensor t = slice(index, index + 1);
  t.shape_.erase(t.shape_.begin());
  return t;
}

namespace {
template <class T>
double read_as_double(const void* p, int64_t i) {
  return double(load(static_cast<const T*>(p)[i]));
}
template <class T>
void write_from_double(void* p, int64_t i, double v) {
  static_cast<T*>(p)[i] = store<T>(compute_t<T>(v));
}

double read_element(DType dtype, const void* p, int64_t i) {
  switch (dtype) {
    case DType::f32:
      return read_as_double<float>(p, i);
    case DType::f64:
      return read_as_double<double>(p, i);
    case DType::bf16:
      return read_as_double<bf16>(p, i);
    case DType::f16:
      return read_as_double<f16>(p, i);
    case DType::i32:
      return read_as_double<int32_t>(p, i);
    case DType::i64:
      return double(static_cast<const int64_t*>(p)[i]);
    case DType::u16:
      return read_as_double<uint16_t>(p, i);
    case DType::u8:
      return read_as_double<uint8_t>(p, i);
    default:
      MEGATRON_FAIL("element access is not supported for dtype " << dtype_name(dtype));
  }
}

void write_element(DType dtype, void* p, int64_t i, double v) {
  switch (dtype) {
    case DType::f32:
      return write_from_double<float>(p, i, v);
    case DType::f64:
      return write_from_double<double>(p, i, v);
    case DType::bf16:
      return write_from_double<bf16>(p, i, v);
    case DType::f16:
      return write_from_double<f16>(p, i, v);
    case DType::i32:
      return write_from_double<int32_t>(p, i, v);
    case DType::i64:
      static_cast<int64_t*>(p)[i] = int64_t(v);
      return;
    case DType::u16:
      return write_from_double<uint16_t>(p, i, v);
    case DType::u8:
      return write_from_double<uint8_t>(p, i, v);
    default:
      MEGATRON_FAIL("element access is not supported for dtype " << dtype_name(dtype));
  }
}

void require_cpu(const Tensor& t, const char* what) {
  MEGATRON_CHECK(t.device().is_cpu(), what << " needs a CPU tensor, got one on " << t.device().str());
}
}  // namespace

double Tensor::item(int64_t flat_index) const {
  MEGATRON_CHECK(flat_index >= 0 && flat_index < numel_,
                 "index " << flat_index << " out of range for " << numel_ << " elements");
  if (device().is_cuda()) return flatten().slice(flat_index, flat_index + 1).to(Device::cpu()).item(0);
  return read_element(dtype_, raw(), flat_index);
}

void Tensor::set_item(int64_t flat_index, double value) {
  require_cpu(*this, "Tensor::set_item");
  MEGATRON_CHECK(flat_index >= 0 && flat_index < numel_,
                 "index " << flat_index << " out of range for " << numel_ << " elements");
  write_element(dtype_, raw(), flat_index, value);
}

std::vector<float> Tensor::to_vector() const {
  if (device().is_cuda()) return to(Device::cpu()).to_vector();
  std::vector<float> out(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) out[size_t(i)] = float(read_element(dtype_, raw(), i));
  return out;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  MEGATRON_CHECK(src.numel() == numel_, "copy of " << shape_str(src.shape()) << " into "
                                                   << shape_str(shape_) << ": element counts differ");
  if (src.dtype() == dtype_) {
    copy_bytes(raw(), device(), src.raw(), src.device(), nbytes());
    return;
  }
  // Dtype conversion happens on the host; device tensors are staged there.
  if (!device().is_cpu() || !src.device().is_cpu()) {
    Tensor host = src.to(Device::cpu()).to(dtype_);
    copy_bytes(raw(), device(), host.raw(), host.device(), nbytes());
    return;
  }
  for (int64_t i = 0; i < numel_; ++i) write_element(dtype_, raw(), i, read_element(src.dtype(), src.raw(), i));
}

void Tensor::fill(double value) {
  require_cpu(*this, "Tensor::fill");
  for (int64_t i = 0; i < numel_; ++i) write_element(dtype_, raw(), i, value);
}

void Tensor::zero() {
  if (numel_ == 0) return;
  allocator_for(device()).memset_zero(raw(), nbytes(), device());
}

void check_shape(const Tensor& t, const Shape& expected, const char* name) {
  MEGATRON_CHECK(t.defined(), name << " is undefined; expected shape " << shape_str(expected));
  MEGATRON_CHECK(t.shape() == expected,
                 name << " has shape " << shape_str(t.shape()) << ", expected " << shape_str(expected));
}

void check_dtype(const Tensor& t, DType expected, const char* name) {
  MEGATRON_CHECK(t.dtype() == expected,
                 name << " has dtype " << dtype_name(t.dtype()) << ", expected " << dtype_name(expected));
}

void check_same_device(const Tensor& a, const Tensor& b, const char* what) {
  MEGATRON_CHECK(a.device() == b.device(),
                 what << ": tensors on different devices (" << a.device().str() << ", " << b.device().str() << ")");
}

}  // namespace megatron
