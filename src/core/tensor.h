#pragma once
// A non-owning view of a tensor's bytes, as read from a checkpoint or generated.
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace anvil {

struct TensorView {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t dim : shape) n *= dim;
    return n;
  }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
};

// "[5760, 90, 16]"
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace anvil
