// Streaming parse of tokenizer.json: a DOM for the small parts, flat arrays for the BPE tables.
#include <fmt/format.h>

#include <limits>

#include "core/error.h"
#include "formats/tokenizer_internal.h"

namespace anvil::tokenizer_detail {

namespace {

using Json = nlohmann::json;

class Handler final : public nlohmann::json_sax<Json> {
 public:
  Handler(TokenizerJson& out, const JsonWhere& where) : out_(out), where_(where) {}

  const std::string& error() const { return error_; }

  bool null() override { return scalar(Json(nullptr)); }
  bool boolean(bool value) override { return scalar(Json(value)); }
  bool number_integer(number_integer_t value) override {
    if (mode_ == Mode::kVocab && nested_ == 0) return vocab_id(value, true);
    return scalar(Json(value));
  }
  bool number_unsigned(number_unsigned_t value) override {
    if (mode_ == Mode::kVocab && nested_ == 0) {
      const bool fits = value <= number_unsigned_t(std::numeric_limits<int64_t>::max());
      return vocab_id(fits ? int64_t(value) : -1, true);
    }
    return scalar(Json(value));
  }
  bool number_float(number_float_t value, const string_t&) override { return scalar(Json(value)); }
  bool binary(binary_t&) override { return scalar(Json(nullptr)); }

  bool string(string_t& value) override {
    if (mode_ == Mode::kMerges) {
      if (nested_ == 0) {
        // The old form: "left right".
        const size_t space = value.find(' ');
        if (space == std::string::npos || value.find(' ', space + 1) != std::string::npos) {
          bad_merge(Json(value).dump());
        } else {
          out_.merges.push_back({slice(std::string_view(value).substr(0, space)),
                                 slice(std::string_view(value).substr(space + 1))});
        }
        ++merge_index_;
        return true;
      }
      if (nested_ == 1 && in_pair_) {
        if (pair_size_ < 2) pair_[pair_size_] = slice(value);
        ++pair_size_;
        return true;
      }
      pair_ok_ = false;
      return true;
    }
    return scalar(Json(std::move(value)));
  }

  bool key(string_t& value) override {
    if (mode_ == Mode::kVocab && nested_ == 0) {
      vocab_key_ = slice(value);
      return true;
    }
    key_ = std::move(value);
    return true;
  }

  bool start_object(std::size_t) override {
    if (mode_ != Mode::kDom) return open_nested();
    if (is_model_table("vocab")) {
      mode_ = Mode::kVocab;
      out_.vocab_streamed = true;
      return true;
    }
    return open(Json::object());
  }

  bool start_array(std::size_t) override {
    if (mode_ == Mode::kMerges && nested_ == 0) {
      in_pair_ = true, pair_size_ = 0, pair_ok_ = true;
      nested_ = 1;
      return true;
    }
    if (mode_ != Mode::kDom) return open_nested();
    if (is_model_table("merges")) {
      mode_ = Mode::kMerges;
      out_.merges_streamed = true;
      return true;
    }
    return open(Json::array());
  }

  bool end_object() override { return close(); }

  bool end_array() override {
    if (mode_ == Mode::kMerges && nested_ == 1 && in_pair_) {
      if (pair_ok_ && pair_size_ == 2) {
        out_.merges.push_back({pair_[0], pair_[1]});
      } else {
        bad_merge(fmt::format("an array of {} strings", pair_size_));
      }
      in_pair_ = false;
      nested_ = 0;
      ++merge_index_;
      return true;
    }
    return close();
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& error) override {
    error_ = error.what();
    return false;
  }

 private:
  enum class Mode { kDom, kVocab, kMerges };

  // The object or array of model.vocab / model.merges is about to open.
  bool is_model_table(const char* name) const {
    return stack_.size() == 2 && stack_.back() == model_ && model_ != nullptr && key_ == name;
  }

  TokenizerJson::Slice slice(std::string_view text) {
    if (out_.arena.size() + text.size() > std::numeric_limits<uint32_t>::max()) {
      where_.at("model").fail("vocab and merges hold over 4 GiB of text");
    }
    const TokenizerJson::Slice result{uint32_t(out_.arena.size()), uint32_t(text.size())};
    out_.arena.append(text);
    return result;
  }

  bool vocab_id(int64_t id, bool is_integer) {
    out_.vocab.push_back({vocab_key_, id, is_integer});
    return true;
  }

  void bad_merge(std::string_view what) {
    if (!out_.bad_merge) {
      out_.bad_merge = merge_index_;
      out_.bad_merge_text = std::string(what);
    }
  }

  bool scalar(Json value) {
    if (mode_ == Mode::kVocab) {
      // A non-integer id: keep the entry so the loader can name it.
      if (nested_ == 0) return vocab_id(-1, false);
      return true;
    }
    if (mode_ == Mode::kMerges) {
      if (nested_ == 0) {
        bad_merge(value.dump());
        ++merge_index_;
      } else {
        pair_ok_ = false;
      }
      return true;
    }
    place(std::move(value));
    return true;
  }

  Json* place(Json value) {
    if (stack_.empty()) {
      out_.root = std::move(value);
      return &out_.root;
    }
    Json& parent = *stack_.back();
    if (parent.is_object()) return &(parent[key_] = std::move(value));
    parent.push_back(std::move(value));
    return &parent.back();
  }

  bool open(Json container) {
    const bool is_model = stack_.size() == 1 && key_ == "model" && container.is_object();
    // Pointers stay valid: only the innermost open container grows, and map nodes never move.
    Json* created = place(std::move(container));
    if (is_model) model_ = created;
    stack_.push_back(created);
    return true;
  }

  bool open_nested() {
    if (mode_ == Mode::kVocab && nested_ == 0) vocab_id(-1, false);
    if (mode_ == Mode::kMerges && nested_ == 0) {
      bad_merge("an object");
      ++merge_index_;
    }
    if (mode_ == Mode::kMerges && nested_ == 1) pair_ok_ = false;
    ++nested_;
    return true;
  }

  bool close() {
    if (mode_ != Mode::kDom) {
      if (nested_ == 0) {
        mode_ = Mode::kDom;
      } else {
        --nested_;
      }
      return true;
    }
    stack_.pop_back();
    return true;
  }

  TokenizerJson& out_;
  const JsonWhere& where_;
  std::vector<Json*> stack_;
  std::string key_;
  Json* model_ = nullptr;
  std::string error_;

  Mode mode_ = Mode::kDom;
  size_t nested_ = 0;  // containers open inside the streamed table
  TokenizerJson::Slice vocab_key_;
  size_t merge_index_ = 0;
  bool in_pair_ = false;
  bool pair_ok_ = true;
  size_t pair_size_ = 0;
  TokenizerJson::Slice pair_[2];
};

}  // namespace

TokenizerJson parse_tokenizer_json(const std::string& json_text, const JsonWhere& where) {
  TokenizerJson result;
  Handler handler(result, where);
  bool ok = false;
  try {
    ok = Json::sax_parse(json_text, &handler);
  } catch (const nlohmann::json::exception& error) {
    where.fail(fmt::format("not valid JSON ({})", error.what()));
  }
  if (!ok) where.fail(fmt::format("not valid JSON ({})", handler.error()));
  return result;
}

}  // namespace anvil::tokenizer_detail
