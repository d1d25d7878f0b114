// The routing kernels' float keys (backend/cuda/order_key.h), checked on the host: the top-k picks
// by comparing keys, so keys must order exactly as the floats compare (cpu::top_k_indices'
// comparison), tie where they compare equal (-0 and +0), put NaN below every number, and decode
// back to the value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backend/cuda/order_key.h"

namespace anvil {
namespace {

using cuda::moe::from_order_key;
using cuda::moe::order_key;

std::vector<float> interesting_values() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, std::numeric_limits<float>::max(),
                               -std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                               -std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                               -std::numeric_limits<float>::denorm_min(), 0.5f, -0.5f, 3.0f, 3.0000002f};
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  while (values.size() < 4000) {
    const float v = cuda::moe::bits_float(bits(rng));
    if (!std::isnan(v)) values.push_back(v);
  }
  return values;
}

TEST(OrderKey, KeysCompareAsTheFloatsDo) {
  const auto values = interesting_values();
  for (size_t i = 0; i < values.size(); ++i)
    for (size_t j = i; j < values.size(); j += 7) {
      const float a = values[i], b = values[j];
      ASSERT_EQ(a < b, order_key(a) < order_key(b)) << a << " vs " << b;
      ASSERT_EQ(a == b, order_key(a) == order_key(b)) << a << " vs " << b;
    }
}

TEST(OrderKey, NanIsBelowEveryNumberAndKeysDecode) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(order_key(nan), 0u);
  EXPECT_EQ(order_key(-nan), 0u);
  EXPECT_LT(order_key(nan), order_key(-std::numeric_limits<float>::infinity()));
  EXPECT_TRUE(std::isnan(from_order_key(0u)));
  for (float v : interesting_values()) {
    const float back = from_order_key(order_key(v));
    if (v == 0.0f) {
      EXPECT_EQ(back, 0.0f);  // -0 comes back as +0: one key for both
    } else {
      EXPECT_EQ(cuda::moe::float_bits(back), cuda::moe::float_bits(v)) << v;
    }
  }
}

}  // namespace
}  // namespace anvil
