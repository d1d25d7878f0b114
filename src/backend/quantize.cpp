#include "backend/quantize.h"

#include <algorithm>
#include <cmath>

#include "backend/e2m1.h"
#include "backend/e4m3.h"
#include "core/dtype.h"
#include "core/error.h"

namespace anvil {

namespace {

const char* target_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::MXFP4: return "MXFP4";
    case WeightFormat::NVFP4: return "NVFP4";
    case WeightFormat::FP8: return "FP8";
    default: return nullptr;
  }
}

constexpr int64_t kRowGrain = 16;

// E4M3 1.0: ModelOpt's replacement for a block scale that rounds to zero.
constexpr uint8_t kE4m3One = 0x38;

void quantize_mxfp4_row(const float* w, int64_t in, uint8_t* codes, uint8_t* scales) {
  for (int64_t b = 0; b < in / 32; ++b) {
    const float* block = w + b * 32;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(block[i]));
    const uint8_t scale = mxfp4_shared_scale(amax);
    scales[b] = scale;
    // Dividing by a power of two is exact (short of subnormal results).
    for (int i = 0; i < 32; i += 2) {
      const uint8_t even = f32_to_e2m1(std::ldexp(block[i], 127 - int(scale)));
      const uint8_t odd = f32_to_e2m1(std::ldexp(block[i + 1], 127 - int(scale)));
      codes[b * 16 + i / 2] = uint8_t(even | odd << 4);
    }
  }
}

void quantize_nvfp4_row(const float* w, int64_t in, float global, uint8_t* codes, uint8_t* scales) {
  for (int64_t b = 0; b < in / 16; ++b) {
    const float* block = w + b * 16;
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(block[i]));
    uint8_t scale = f32_to_e4m3(amax / (6.0f * global));
    if ((scale & 0x7f) == 0) scale = kE4m3One;
    scales[b] = scale;
    const float divisor = fp8_e4m3_to_f32(scale) * global;
    for (int i = 0; i < 16; i += 2) {
      const uint8_t even = f32_to_e2m1(block[i] / divisor);
      const uint8_t odd = f32_to_e2m1(block[i + 1] / divisor);
      codes[b * 8 + i / 2] = uint8_t(even | odd << 4);
    }
  }
}

}  // namespace

uint8_t f32_to_e2m1(float x) { return e2m1_nearest(x); }

uint8_t f32_to_e4m3(float x) { return e4m3_nearest(x); }

uint8_t mxfp4_shared_scale(float amax) {
  if (amax == 0.0f) return 0;
  const int exponent = std::clamp(std::ilogb(amax) - 2, -127, 127);
  return uint8_t(exponent + 127);
}

QuantizedLinear quantize_linear(const LinearWeight& source, WeightFormat target, const std::string& name,
                                ThreadPool& pool) {
  const char* target_text = target_name(target);
  if (target_text == nullptr) fail("{}: can only be quantized to MXFP4, NVFP4 or FP8", name);
  const int64_t out = source.out_features, in = source.in_features;
  const int64_t block = target == WeightFormat::MXFP4 ? 32 : target == WeightFormat::NVFP4 ? 16 : 1;
  if (in % block != 0) {
    fail("{}: in_features {} is not a multiple of {}, the {} block size", name, in, block, target_text);
  }
  if (out > 0) {
    std::vector<float> probe(static_cast<size_t>(in));
    linear_decode_row(source, 0, probe.data());  // validates the layer here rather than on a worker
  }

  QuantizedLinear result;
  LinearWeight& weight = result.weight_;
  weight.format = target;
  weight.out_features = out;
  weight.in_features = in;
  weight.bias = source.bias;
  const size_t elements = size_t(out) * size_t(in);
  if (target == WeightFormat::FP8) {
    result.data_.resize(elements);
    result.row_scales_.resize(size_t(out));
  } else {
    result.data_.resize(elements / 2);
    result.scales_.resize(elements / size_t(block));
  }

  // Each row's largest magnitude and its first non-finite weight. Workers must not throw, so the
  // error is raised afterwards.
  std::vector<float> row_amax(size_t(out), 0.0f);
  std::vector<int64_t> bad_column(size_t(out), -1);
  auto scan_row = [&](int64_t r, const float* w) {
    float amax = 0.0f;
    for (int64_t i = 0; i < in; ++i) {
      if (!std::isfinite(w[i])) {
        bad_column[size_t(r)] = i;
        return;
      }
      amax = std::max(amax, std::fabs(w[i]));
    }
    row_amax[size_t(r)] = amax;
  };
  auto quantize_row = [&](int64_t r, const float* w) {
    switch (target) {
      case WeightFormat::MXFP4:
        quantize_mxfp4_row(w, in, result.data_.data() + r * in / 2, result.scales_.data() + r * in / 32);
        break;
      case WeightFormat::NVFP4:
        quantize_nvfp4_row(w, in, weight.global_scale, result.data_.data() + r * in / 2,
                           result.scales_.data() + r * in / 16);
        break;
      default: {
        // As for NVFP4's global scale: a row too small for amax / 448 to be nonzero is all zeros.
        const float scale = row_amax[size_t(r)] / 448.0f > 0.0f ? row_amax[size_t(r)] / 448.0f : 1.0f;
        result.row_scales_[size_t(r)] = scale;
        uint8_t* codes = result.data_.data() + r * in;
        for (int64_t i = 0; i < in; ++i) codes[i] = f32_to_e4m3(w[i] / scale);
        break;
      }
    }
  };
  // Calls row(r, decoded row r) for every row, on the pool.
  auto for_each_row = [&](const auto& row) {
    pool.parallel_for(
        out,
        [&](int64_t begin, int64_t end) {
          std::vector<float> w(static_cast<size_t>(in));
          for (int64_t r = begin; r < end; ++r) {
            linear_decode_row(source, r, w.data());
            row(r, w.data());
          }
        },
        kRowGrain);
  };
  auto check_finite = [&] {
    for (int64_t r = 0; r < out; ++r) {
      if (bad_column[size_t(r)] >= 0) {
        fail("{}: weight [{}, {}] is not finite, so the layer cannot be quantized to {}", name, r,
             bad_column[size_t(r)], target_text);
      }
    }
  };

  if (target == WeightFormat::NVFP4) {
    // The global scale needs every row's magnitude before any row is quantized: two passes.
    for_each_row(scan_row);
    check_finite();
    const float amax = out > 0 ? *std::max_element(row_amax.begin(), row_amax.end()) : 0.0f;
    // A tensor whose largest weight is below about 2^-138 has a global scale that underflows; its
    // weights all quantize to zero with any scale, so 1 serves as for an all-zero tensor.
    const float global = amax / (6.0f * 448.0f);
    weight.global_scale = global > 0.0f ? global : 1.0f;
    for_each_row(quantize_row);
  } else {
    // MXFP4 and FP8 need only the row itself: each row is decoded once.
    for_each_row([&](int64_t r, const float* w) {
      scan_row(r, w);
      if (bad_column[size_t(r)] < 0) quantize_row(r, w);
    });
    check_finite();
  }

  weight.data = result.data_.data();
  weight.scales = result.scales_.empty() ? nullptr : result.scales_.data();
  weight.row_scales = result.row_scales_.empty() ? nullptr : result.row_scales_.data();
  return result;
}

LinearWeight QuantizedStore::convert(const LinearWeight& source, std::optional<WeightFormat> target,
                                     const std::string& name, ThreadPool& pool) {
  if (!target || *target == source.format) return source;
  layers_.push_back(std::make_unique<QuantizedLinear>(quantize_linear(source, *target, name, pool)));
  return layers_.back()->weight();
}

}  // namespace anvil
