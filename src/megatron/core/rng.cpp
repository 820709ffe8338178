#include "megatron/core/rng.h"

#include <sstream>

#include "megatron/core/error.h"

namespace megatron {

uint64_t HostRng::uniform_int(uint64_t n) {
  MEGATRON_CHECK(n > 0, "uniform_int needs a positive bound");
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;  // accept [0, limit), a multiple of n
  uint64_t x;
  do {
    x = engine_();
  } while (x >= limit);
  return x % n;
}

std::string HostRng::state() const {
  std::ostringstream os;
  os << engine_;
  return os.str();
}

void HostRng::set_state(const std::string& state) {
  std::istringstream is(state);
  is >> engine_;
  MEGATRON_CHECK(!is.fail(), "invalid host RNG state in checkpoint");
}

}  // namespace megatron
