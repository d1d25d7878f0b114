#include "models/cuda_support.h"

#include <bit>

#if ANVIL_WITH_CUDA
#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace anvil {

namespace {

cuda::DummyFill device_fill(const DummyRecipe& recipe, DType dtype) {
  cuda::DummyFill fill;
  fill.name_hash = recipe.name_hash;
  fill.bound = recipe.bound;
  fill.constant = recipe.constant;
  switch (recipe.kind) {
    case DummyRecipe::Kind::Uniform: fill.kind = cuda::DummyFill::Kind::Uniform; break;
    case DummyRecipe::Kind::Norm: fill.kind = cuda::DummyFill::Kind::Norm; break;
    case DummyRecipe::Kind::RandomBytes: fill.kind = cuda::DummyFill::Kind::RandomBytes; break;
    case DummyRecipe::Kind::Constant: fill.kind = cuda::DummyFill::Kind::Constant; break;
  }
  fill.type = dtype == DType::U8 ? cuda::DummyFill::Type::U8
              : dtype == DType::F32 ? cuda::DummyFill::Type::F32
                                    : cuda::DummyFill::Type::BF16;
  return fill;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

void* DeviceWeights::allocate(size_t bytes) {
  buffers_.emplace_back(bytes);
  bytes_ += bytes;
  return buffers_.back().get();
}

void DeviceWeights::fill_bf16(uint16_t* target, const std::string& name, const std::vector<int64_t>& shape) {
  const int64_t n = numel_of(shape);
  if (auto recipe = source_.dummy_recipe(name, shape, DType::BF16)) {
    cuda::dummy_fill(target, n, device_fill(*recipe, DType::BF16), nullptr);
    source_.count_external(size_t(n) * 2);
    return;
  }
  const TensorView view = source_.get(name, shape, DType::BF16, {DType::BF16, DType::F32, DType::F16});
  if (view.dtype == DType::BF16) {
    cuda::copy_to_device(target, view.data, size_t(n) * 2);
    cuda::synchronize();  // the source is pageable memory; the copy must finish before it goes
    return;
  }
  // A float32 or float16 checkpoint: convert a slice at a time so no full host copy exists.
  constexpr int64_t kSlice = int64_t(1) << 22;
  std::vector<uint16_t> staging(size_t(std::min(n, kSlice)));
  for (int64_t first = 0; first < n; first += kSlice) {
    const int64_t count = std::min(kSlice, n - first);
    for (int64_t i = 0; i < count; ++i) {
      const float value = view.dtype == DType::F32 ? static_cast<const float*>(view.data)[first + i]
                                                   : f16_to_f32(static_cast<const uint16_t*>(view.data)[first + i]);
      staging[size_t(i)] = f32_to_bf16(value);
    }
    cuda::copy_to_device(target + first, staging.data(), size_t(count) * 2);
    cuda::synchronize();
  }
}

const uint16_t* DeviceWeights::bf16(const std::string& name, const std::vector<int64_t>& shape) {
  auto* target = static_cast<uint16_t*>(allocate(size_t(numel_of(shape)) * 2));
  fill_bf16(target, name, shape);
  return target;
}

const uint16_t* DeviceWeights::stacked_bf16(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                                            int64_t in) {
  int64_t total_rows = 0;
  for (int64_t r : rows) total_rows += r;
  auto* target = static_cast<uint16_t*>(allocate(size_t(total_rows * in) * 2));
  int64_t offset = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    fill_bf16(target + offset * in, names[i], {rows[i], in});
    offset += rows[i];
  }
  return target;
}

cuda::DenseWeight DeviceWeights::dense(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                                       int64_t in, bool fp8) {
  cuda::DenseWeight weight;
  if (!fp8) {
    weight.data = stacked_bf16(names, rows, in);
    return weight;
  }
  if (in % 16 != 0) fail("{}: in_features {} is not a multiple of 16, which FP8 on CUDA needs", names[0], in);
  int64_t total_rows = 0;
  for (int64_t r : rows) total_rows += r;
  cuda::DeviceBuffer staging(size_t(total_rows * in) * 2);
  int64_t offset = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    fill_bf16(staging.get<uint16_t>() + offset * in, names[i], {rows[i], in});
    offset += rows[i];
  }
  auto* codes = static_cast<uint8_t*>(allocate(size_t(total_rows * in)));
  auto* scales = static_cast<float*>(allocate(size_t(total_rows) * sizeof(float)));
  int64_t bad = cuda::quantize_fp8_rows(staging.get<uint16_t>(), total_rows, in, codes, scales, nullptr);
  if (bad >= 0) {
    size_t part = 0;
    while (bad >= rows[part]) bad -= rows[part++];
    fail("{}: row {} holds a non-finite weight, so the layer cannot be quantized to FP8", names[part], bad);
  }
  weight.format = cuda::DenseWeight::Format::FP8;
  weight.data = codes;
  weight.row_scales = scales;
  return weight;
}

const uint8_t* DeviceWeights::u8(const std::string& name, const std::vector<int64_t>& shape) {
  return upload_u8(name, shape);
}

uint8_t* DeviceWeights::upload_u8(const std::string& name, const std::vector<int64_t>& shape) {
  auto* target = static_cast<uint8_t*>(allocate(size_t(numel_of(shape))));
  fill_u8(target, name, shape);
  return target;
}

void DeviceWeights::fill_u8(uint8_t* target, const std::string& name, const std::vector<int64_t>& shape) {
  const int64_t n = numel_of(shape);
  if (auto recipe = source_.dummy_recipe(name, shape, DType::U8)) {
    cuda::dummy_fill(target, n, device_fill(*recipe, DType::U8), nullptr);
    source_.count_external(size_t(n));
    return;
  }
  const TensorView view = source_.get(name, shape, DType::U8, {DType::U8});
  cuda::copy_to_device(target, view.data, size_t(n));
  cuda::synchronize();
}

DeviceWeights::Experts DeviceWeights::experts(const std::string& prefix, int64_t experts, int64_t rows, int64_t in,
                                              cuda::ExpertFormat format) {
  Experts result;
  if (format == cuda::ExpertFormat::FP8) {
    // The MXFP4 codes and scales are staging only; FP8 codes take twice their bytes.
    cuda::DeviceBuffer mx_codes(size_t(experts * rows * in / 2)), mx_scales(size_t(experts * rows * (in / 32)));
    fill_u8(mx_codes.get<uint8_t>(), prefix + "_blocks", {experts, rows, in / 32, 16});
    fill_u8(mx_scales.get<uint8_t>(), prefix + "_scales", {experts, rows, in / 32});
    auto* codes = static_cast<uint8_t*>(allocate(size_t(experts * rows * in)));
    auto* row_scales = static_cast<float*>(allocate(size_t(experts * rows) * sizeof(float)));
    const int64_t bad = cuda::quantize_mxfp4_experts_to_fp8(mx_codes.get<uint8_t>(), mx_scales.get<uint8_t>(), experts,
                                                            rows, in, codes, row_scales, nullptr);
    if (bad >= 0)
      fail("{}: expert {} row {} holds a non-finite weight, so the experts cannot be quantized to FP8", prefix,
           bad / rows, bad % rows);
    result.codes = codes;
    result.row_scales = row_scales;
    return result;
  }
  if (format == cuda::ExpertFormat::MXFP4) {
    // The checkpoint's order is staging only: the kernels read mxfp4_lay_out's layout.
    cuda::DeviceBuffer mx_codes(size_t(experts * rows * in / 2)), mx_scales(size_t(experts * rows * (in / 32)));
    fill_u8(mx_codes.get<uint8_t>(), prefix + "_blocks", {experts, rows, in / 32, 16});
    fill_u8(mx_scales.get<uint8_t>(), prefix + "_scales", {experts, rows, in / 32});
    auto* codes = static_cast<uint8_t*>(allocate(size_t(experts * rows * cuda::mxfp4_device_row_bytes(in))));
    auto* scales = static_cast<uint8_t*>(allocate(size_t(experts * rows * cuda::mxfp4_device_scale_row_bytes(in))));
    cuda::mxfp4_lay_out(mx_codes.get<uint8_t>(), mx_scales.get<uint8_t>(), experts * rows, in, codes, scales, nullptr);
    cuda::synchronize();
    result.codes = codes;
    result.scales = scales;
    return result;
  }
  uint8_t* codes = upload_u8(prefix + "_blocks", {experts, rows, in / 32, 16});
  result.codes = codes;
  // The MXFP4 scales are only needed while the codes are re-quantized; the staging copy goes.
  cuda::DeviceBuffer mx_scales(size_t(experts * rows * (in / 32)));
  fill_u8(mx_scales.get<uint8_t>(), prefix + "_scales", {experts, rows, in / 32});
  auto* scales = static_cast<uint8_t*>(allocate(size_t(experts * rows * (in / 16))));
  auto* row_scales = static_cast<float*>(allocate(size_t(experts * rows) * sizeof(float)));
  const int64_t bad = cuda::quantize_mxfp4_experts_to_nvfp4(codes, mx_scales.get<uint8_t>(), experts, rows, in, scales,
                                                            row_scales, nullptr);
  if (bad >= 0)
    fail("{}: expert {} row {} holds a non-finite weight, so the experts cannot be quantized to NVFP4", prefix,
         bad / rows, bad % rows);
  result.scales = scales;
  result.row_scales = row_scales;
  cuda::mxfp4_pack_codes(codes, size_t(experts * rows * in / 2), nullptr);
  cuda::synchronize();
  return result;
}

DeviceWeights::Experts DeviceWeights::quantized_experts(const std::vector<std::vector<std::string>>& names,
                                                        int64_t rows, int64_t in, cuda::ExpertFormat format) {
  const int64_t experts = int64_t(names.size()), parts = names.empty() ? 1 : int64_t(names[0].size());
  const int64_t n = parts * rows, row_bytes = format == cuda::ExpertFormat::FP8 ? in : in / 2;
  const int64_t scale_cols = format == cuda::ExpertFormat::FP8 ? 0 : in / (format == cuda::ExpertFormat::NVFP4 ? 16 : 32);
  if (in % 32 != 0) fail("{}: in_features {} is not a multiple of 32, which quantized experts on CUDA need", names[0][0], in);
  Experts result;
  // MXFP4 is quantized one expert at a time into checkpoint order (mx_codes, mx_scales), then laid
  // out (mxfp4_lay_out); the other formats are written in place.
  const bool mx = format == cuda::ExpertFormat::MXFP4;
  const int64_t stored_row_bytes = cuda::expert_code_row_bytes(format, in);
  const int64_t stored_scale_cols = cuda::expert_scale_row_bytes(format, in);
  auto* codes = static_cast<uint8_t*>(allocate(size_t(experts * n * stored_row_bytes)));
  auto* scales = stored_scale_cols > 0 ? static_cast<uint8_t*>(allocate(size_t(experts * n * stored_scale_cols))) : nullptr;
  auto* row_scales = cuda::expert_row_scale_bytes(format) > 0 ? static_cast<float*>(allocate(size_t(experts * n) * 4)) : nullptr;
  cuda::DeviceBuffer staging(size_t(rows * in) * 2);
  cuda::DeviceBuffer mx_codes(mx ? size_t(n * row_bytes) : 0), mx_scales(mx ? size_t(n * scale_cols) : 0);
  for (int64_t e = 0; e < experts; ++e) {
    uint8_t* expert_codes = mx ? mx_codes.get<uint8_t>() : codes + e * n * row_bytes;
    uint8_t* expert_scales = mx ? mx_scales.get<uint8_t>() : scales ? scales + e * n * scale_cols : nullptr;
    for (int64_t part = 0; part < parts; ++part) {
      const std::string& name = names[size_t(e)][size_t(part)];
      fill_bf16(staging.get<uint16_t>(), name, {rows, in});
      const int64_t bad = cuda::quantize_bf16_expert_rows(staging.get<uint16_t>(), rows, in, format, expert_codes,
                                                          expert_scales, row_scales ? row_scales + e * n : nullptr, part,
                                                          parts, nullptr);
      if (bad >= 0) fail("{}: row {} holds a non-finite weight, so the expert cannot be quantized", name, bad);
    }
    if (mx)
      cuda::mxfp4_lay_out(expert_codes, expert_scales, n, in, codes + e * n * stored_row_bytes,
                          scales + e * n * stored_scale_cols, nullptr);
  }
  if (format == cuda::ExpertFormat::NVFP4) cuda::mxfp4_pack_codes(codes, size_t(experts * n * row_bytes), nullptr);
  cuda::synchronize();
  result.codes = codes;
  result.scales = scales;
  result.row_scales = row_scales;
  return result;
}

const float* DeviceWeights::f32(const std::string& name, const std::vector<int64_t>& shape) {
  return upload(load_f32(source_, name, shape));
}

const float* DeviceWeights::upload(const std::vector<float>& host) {
  auto* target = static_cast<float*>(allocate(host.size() * sizeof(float)));
  cuda::copy_to_device(target, host.data(), host.size() * sizeof(float));
  cuda::synchronize();
  return target;
}

DeviceStep::DeviceStep() = default;

DeviceStep::~DeviceStep() { cuda::host_free_pinned(pinned_); }

void DeviceStep::upload(const StepBatch& batch, const KvLayout& layout, const ModelConfig& config,
                        cuda::Stream stream, bool graph_shapes) {
  const int num_groups = layout.num_groups();
  const int64_t num_seqs = int64_t(batch.sequences.size());
  rows = int64_t(batch.tokens.size());
  std::vector<int32_t> row_positions, row_sequence, logit_index, row_begin{0}, start_pos;
  int64_t max_context = 0, max_new = 0;
  std::vector<int64_t> max_blocks(size_t(num_groups), 1);
  int64_t row = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const SequenceStep& seq = batch.sequences[size_t(s)];
    if (int(seq.block_tables.size()) != num_groups)
      fail("step has {} block tables for a model with {} KV groups", seq.block_tables.size(), num_groups);
    if (seq.num_tokens <= 0) fail("a sequence in a step has no tokens");
    if (config.max_position_embeddings > 0 && seq.start_pos + seq.num_tokens > config.max_position_embeddings)
      fail("sequence length {} exceeds max_position_embeddings {}", seq.start_pos + seq.num_tokens,
           config.max_position_embeddings);
    for (int64_t t = 0; t < seq.num_tokens; ++t) {
      row_positions.push_back(int32_t(seq.start_pos + t));
      row_sequence.push_back(int32_t(s));
      if (seq.all_logits || (seq.need_logits && t == seq.num_tokens - 1)) logit_index.push_back(int32_t(row + t));
    }
    row += seq.num_tokens;
    row_begin.push_back(int32_t(row));
    start_pos.push_back(int32_t(seq.start_pos));
    max_context = std::max(max_context, seq.start_pos + seq.num_tokens);
    max_new = std::max(max_new, seq.num_tokens);
    for (int g = 0; g < num_groups; ++g) {
      max_blocks[size_t(g)] = std::max<int64_t>(max_blocks[size_t(g)], int64_t(seq.block_tables[size_t(g)].size()));
    }
  }
  if (row != rows) fail("step lists {} tokens but its sequences cover {}", rows, row);
  if (graph_shapes) {
    for (auto& stride : max_blocks) stride = int64_t(std::bit_ceil(uint64_t(std::max<int64_t>(stride, 16))));
    // Only the split count of decode attention reads max_context; an upper bound that does not
    // move keeps it fixed (the kernels find each sequence's real length on the device).
    max_context = config.max_position_embeddings > 0 ? config.max_position_embeddings : int64_t(1) << 17;
  }
  logit_rows = int64_t(logit_index.size());

  // One int32 image: tokens | positions | row_sequence | logit_index | row_begin | start_pos |
  // block tables of each group. Offsets are remembered to point into the device copy.
  host_.clear();
  auto append = [&](const int32_t* data, size_t count) {
    const size_t offset = host_.size();
    host_.insert(host_.end(), data, data + count);
    return offset;
  };
  const size_t tokens_at = append(batch.tokens.data(), batch.tokens.size());
  const size_t positions_at = append(row_positions.data(), row_positions.size());
  const size_t row_sequence_at = append(row_sequence.data(), row_sequence.size());
  const size_t logit_at = append(logit_index.data(), logit_index.size());
  const size_t row_begin_at = append(row_begin.data(), row_begin.size());
  const size_t start_pos_at = append(start_pos.data(), start_pos.size());
  std::vector<size_t> table_at(static_cast<size_t>(num_groups));
  for (int g = 0; g < num_groups; ++g) {
    table_at[size_t(g)] = host_.size();
    for (const auto& seq : batch.sequences) {
      const auto& table = seq.block_tables[size_t(g)];
      host_.insert(host_.end(), table.begin(), table.end());
      host_.insert(host_.end(), size_t(max_blocks[size_t(g)]) - table.size(), -1);
    }
  }
  for (int32_t token : batch.tokens)
    if (token < 0 || token >= config.vocab_size)
      fail("token id {} is outside the vocabulary (size {})", token, config.vocab_size);

  const size_t bytes = host_.size() * sizeof(int32_t);
  if (pinned_capacity_ < bytes) {
    cuda::synchronize(stream);  // the previous step's copy may still read the old buffer
    cuda::host_free_pinned(pinned_);
    pinned_capacity_ = bytes * 2;
    pinned_ = static_cast<int32_t*>(cuda::host_alloc_pinned(pinned_capacity_));
  }
  if (device_.bytes() < bytes) {
    cuda::synchronize(stream);
    device_ = cuda::DeviceBuffer(bytes * 2);
    ++generation_;
  }
  // The previous step's upload has finished by now: its logits were copied back synchronously.
  std::memcpy(pinned_, host_.data(), bytes);
  cuda::copy_to_device(device_.get(), pinned_, bytes, stream);

  const int32_t* base = device_.get<int32_t>();
  tokens = base + tokens_at;
  positions = base + positions_at;
  logit_row_index = base + logit_at;
  groups.assign(size_t(num_groups), {});
  for (int g = 0; g < num_groups; ++g) {
    cuda::AttentionBatch& view = groups[size_t(g)];
    view.num_rows = rows;
    view.num_sequences = num_seqs;
    view.max_blocks = max_blocks[size_t(g)];
    view.max_context = max_context;
    view.max_new_tokens = max_new;
    view.row_begin = base + row_begin_at;
    view.start_pos = base + start_pos_at;
    view.block_tables = base + table_at[size_t(g)];
    view.row_sequence = base + row_sequence_at;
    view.row_position = base + positions_at;
  }
}

namespace {
constexpr int64_t kMaxGraphRows = 256;
constexpr size_t kMaxGraphs = 128;
}  // namespace

void CudaStepRunner::run(const StepBatch& batch, const KvLayout& layout, const ModelConfig& config,
                         const std::vector<KvGroupStorage>& kv_cache, float* logits, int32_t* token_ids,
                         const std::function<void(bool argmax)>& enqueue, const RowSampling* sampling) {
  const cuda::Stream s = stream.get();
  const Mode mode = token_ids == nullptr ? Mode::Logits : sampling ? Mode::Sample : Mode::Greedy;
  // Decode steps get graph-shaped metadata whether or not graphs are on, so that
  // --enforce-eager computes bit for bit what the graphs do.
  const bool decode = !batch.sequences.empty() && batch.tokens.size() == batch.sequences.size() &&
                      batch.tokens.size() <= size_t(kMaxGraphRows);
  step.upload(batch, layout, config, s, decode);
  // The draw's parameters go to a fixed device buffer that a captured graph reads, ahead of the
  // step on the same stream; the buffers are taken before any capture, which must not allocate.
  RowSampling* device_sampling = nullptr;
  int32_t* sampled_ids = nullptr;
  if (mode == Mode::Sample && step.logit_rows > 0) {
    device_sampling = arena.get<RowSampling>(kSamplingSlot, step.logit_rows);
    sampled_ids = arena.get<int32_t>(kSampledIdsSlot, step.logit_rows);
    cuda::copy_to_device(device_sampling, sampling, size_t(step.logit_rows) * sizeof(RowSampling), s);
  }
  auto enqueue_step = [&] {
    enqueue(mode == Mode::Greedy);
    if (mode == Mode::Sample && step.logit_rows > 0) {
      cuda::sample_rows(device_logits, step.logit_rows, config.vocab_size, device_sampling, sampled_ids, s);
      marks.record("sample");
    }
  };
  bool timed = false;
  if (!decode || !graphs_enabled || marks.enabled()) {
    marks.record("start");
    enqueue_step();
  } else {
    GraphKey key{step.rows, step.logit_rows, mode, {}, {}};
    for (const auto& view : step.groups) key.strides.push_back(view.max_blocks);
    for (const auto& storage : kv_cache) key.caches.push_back(storage.device_layout());
    // Each cache a caller creates (a bench, a test) makes new keys; keep the map bounded.
    if (graphs_.size() >= kMaxGraphs && !graphs_.count(key)) graphs_.clear();
    GraphEntry& entry = graphs_[key];
    if (entry.step_generation != step.generation() || entry.arena_generation != arena.generation()) {
      entry.graph.reset();  // captured against buffers that have moved since
      entry.warm = false;
    }
    if (entry.graph.ready()) {
      replay_timer_.start();
      entry.graph.launch(s);
      replay_timer_.stop();
      timed = true;
    } else if (entry.warm) {
      // Second run of this shape with the same buffers: everything it needs exists, so the
      // capture allocates nothing.
      cuda::StreamGraph::begin_capture(s);
      try {
        enqueue_step();
        entry.graph.end_capture(s);
      } catch (...) {
        cuda::StreamGraph::abort_capture(s);
        throw;
      }
      entry.graph.launch(s);
    } else {
      enqueue_step();
      entry.warm = true;
      entry.step_generation = step.generation();
      entry.arena_generation = arena.generation();
    }
  }
  if (step.logit_rows > 0) {
    if (mode == Mode::Logits)
      cuda::copy_to_host(logits, device_logits, size_t(step.logit_rows * config.vocab_size) * sizeof(float), s);
    else
      cuda::copy_to_host(token_ids, mode == Mode::Sample ? sampled_ids : device_ids,
                         size_t(step.logit_rows) * sizeof(int32_t), s);
  }
  cuda::synchronize(s);
  if (timed) {
    replay_ms_ += replay_timer_.elapsed_ms();
    ++replays_;
  }
}

double CudaStepRunner::take_replay_ms() {
  const double per_replay = replays_ > 0 ? replay_ms_ / double(replays_) : 0.0;
  replay_ms_ = 0;
  replays_ = 0;
  return per_replay;
}

}  // namespace anvil
#endif
