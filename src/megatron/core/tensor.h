#pragma once
// Tensor: a typed, shaped window onto shared storage. Always contiguous row-major; views
// select a range along the first dimension or reinterpret the shape. No broadcasting.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "megatron/core/dtype.h"
#include "megatron/core/error.h"

namespace megatron {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index) { return {DeviceType::cuda, index}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const;
};

// A block of memory and the function that gives it back. Allocation goes through the device's
// allocator (core/memory.h); a Storage may also wrap memory it does not own.
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device;
  void (*release)(void* data, size_t bytes, Device device) = nullptr;
  bool memory_released = false;  // Tensor::release_memory(): no memory until reacquire_memory()
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  // A tensor as empty() makes it, but released from the start (release_memory): no memory until
  // reacquire_memory(), so a buffer first needed later never leaves a hole where it was.
  static Tensor released(const Shape& shape, DType dtype, Device device = Device::cpu());
  // Wraps memory owned elsewhere; the caller keeps it alive for the tensor's lifetime.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = Device::cpu());
  // CPU tensor holding the given values, converted to dtype.
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::f32);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const;
  const Shape& shape() const { return shape_; }
  int ndim() const { return int(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return size_t(numel_) * dtype_size(dtype_); }
  size_t element_size() const { return dtype_size(dtype_); }

  void* raw();
  const void* raw() const;
  template <class T>
  T* data() {
    check_type(dtype_of<T>());
    return static_cast<T*>(raw());
  }
  template <class T>
  const T* data() const {
    check_type(dtype_of<T>());
    return static_cast<const T*>(raw());
  }

  // Views share storage.
  Tensor view(const Shape& shape) const;           // same numel; one dim may be -1
  Tensor slice(int64_t begin, int64_t end) const;  // rows [begin, end) of dim 0
  Tensor select(int64_t index) const;              // row index of dim 0, that dim dropped
  Tensor flatten() const { return view({numel_}); }

  // Copies.
  Tensor clone() const;
  Tensor to(DType dtype) const;       // converting copy on the same device
  Tensor to(Device device) const;     // copy to another device (this tensor if already there)
  void copy_from(const Tensor& src);  // same numel, any devices; dtype conversion through the host
  void fill(double value);            // CPU
  void zero();                        // any device

  // Element access for tests and host-side code (converts through double; CUDA tensors are
  // copied to the host first, so keep these out of hot loops).
  double item(int64_t flat_index = 0) const;
  void set_item(int64_t flat_index, double value);
  std::vector<float> to_vector() const;

  bool same_storage(const Tensor& other) const { return storage_ == other.storage_; }

  // Memory a buffer needs only part of the time (the main gradients, between the optimizer step
  // and the next backward): release_memory() gives the memory of this tensor's storage back while
  // every view of it stays a valid object; reading or writing any of them is an error until
  // reacquire_memory() gives the storage new memory (contents undefined). Called on the tensor
  // that owns the whole storage (Tensor::empty's result, not a view or a from_blob).
  void release_memory();
  void reacquire_memory();
  bool memory_held() const { return defined() && !storage_->memory_released; }

 private:
  void check_type(DType requested) const;
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes from storage start
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
};

// Shape checks used by ops: throw an Error naming the tensor, the expectation and the actual.
void check_shape(const Tensor& t, const Shape& expected, const char* name);
void check_dtype(const Tensor& t, DType expected, const char* name);
void check_same_device(const Tensor& a, const Tensor& b, const char* what);

}  // namespace megatron
