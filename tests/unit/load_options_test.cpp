// --dtype / --kv-cache-dtype: vLLM's spellings parse, anything else is a one-line error naming
// the flag, and the CPU backend refuses precisions it does not compute in instead of ignoring them.
#include <gtest/gtest.h>

#include "core/error.h"
#include "models/model.h"
#include "support/test_support.h"

namespace anvil {
namespace {

TEST(LoadOptions, DtypeSpellings) {
  EXPECT_EQ(parse_compute_dtype("auto"), ComputeDtype::Auto);
  EXPECT_EQ(parse_compute_dtype("bfloat16"), ComputeDtype::BF16);
  EXPECT_EQ(parse_compute_dtype("float32"), ComputeDtype::F32);
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), KvCacheDtype::FP8_E4M3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3"), KvCacheDtype::FP8_E4M3);
  EXPECT_EQ(parse_kv_cache_dtype("float32"), KvCacheDtype::F32);
  try {
    parse_compute_dtype("float16");
    FAIL() << "float16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dtype 'float16'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_kv_cache_dtype("fp8_e5m2"), Error);
}

TEST(LoadOptions, KvCacheDtypeFollowsDtype) {
  LoadOptions options;
  EXPECT_EQ(resolve_kv_dtype(options), cuda::KvDtype::BF16);
  options.dtype = ComputeDtype::F32;
  EXPECT_EQ(resolve_kv_dtype(options), cuda::KvDtype::F32);
  options.kv_cache_dtype = KvCacheDtype::FP8_E4M3;
  EXPECT_EQ(resolve_kv_dtype(options), cuda::KvDtype::FP8_E4M3);
}

TEST(LoadOptions, TheCpuRefusesBf16AndFp8) {
  const auto dir = test::fixtures_dir() / "gpt-oss-tiny";
  LoadOptions options;
  options.dtype = ComputeDtype::BF16;
  EXPECT_THROW(load_model(dir, options), Error);
  options.dtype = ComputeDtype::F32;
  options.kv_cache_dtype = KvCacheDtype::FP8_E4M3;
  EXPECT_THROW(load_model(dir, options), Error);
  options.kv_cache_dtype = KvCacheDtype::Auto;
  EXPECT_NO_THROW(load_model(dir, options));
}

}  // namespace
}  // namespace anvil
