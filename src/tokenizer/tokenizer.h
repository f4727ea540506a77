// Public API of the HuggingFace-compatible tokenizer: loads tokenizer.json (+ tokenizer_config.json and
// generation_config.json from a model directory), encodes text to ids exactly as HF `tokenizers` does, decodes
// ids back to text (in one go or incrementally with StreamDecoder), and exposes the special-token ids and the
// chat template that training and generation need. See docs/tokenizers.md for what is supported.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lmtune {

class GgufFile;

namespace tok {
struct Pipeline;  // normalizer, pre-tokenizer, model, post-processor, decoder (tokenizer_internal.h)
}

class Tokenizer {
 public:
  // `file_or_dir` is a tokenizer.json, or a directory holding tokenizer.json and optionally
  // tokenizer_config.json and generation_config.json, or a GGUF model (a .gguf file or a directory holding one, see
  // find_gguf_model). Throws FileError / ConfigError.
  static Tokenizer load(const std::filesystem::path& file_or_dir);
  // The tokenizer of a GGUF model from its tokenizer.ggml.* keys and tokenizer.chat_template (gguf_vocab.cpp).
  static Tokenizer from_gguf(const GgufFile& file);
  // Parses tokenizer.json content held in memory; `name` is used in error messages.
  static Tokenizer from_json_string(std::string_view json, const std::string& name = "tokenizer.json");

  // add_special_tokens applies the post-processor (e.g. prepends <s>/<bos>), like HF's encode(..., True).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Runs the decoder chain; invalid UTF-8 is replaced by U+FFFD. No transformers-level
  // clean_up_tokenization_spaces is applied (decode(encode(x)) == x for lossless tokenizers).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  int vocab_size() const;  // highest id + 1, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string& token(int32_t id) const;  // vocabulary form, e.g. "Ġthe" or "▁the"; throws if out of range
  bool is_special(int32_t id) const;           // an added token marked "special"

  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::vector<int32_t> eos_ids() const { return eos_ids_; }  // tokenizer_config eos_token ∪ generation_config
  std::optional<int32_t> pad_id() const { return pad_id_; }
  const std::string& bos_token() const { return bos_token_; }  // "" when none
  const std::string& eos_token() const { return eos_token_; }
  bool add_bos_token() const { return add_bos_token_; }
  const std::string& chat_template() const { return chat_template_; }  // "" when the model has none

  const tok::Pipeline& pipeline() const { return *pipeline_; }

 private:
  Tokenizer() = default;
  void read_tokenizer_config(const std::filesystem::path& file);
  void read_generation_config(const std::filesystem::path& file);
  std::optional<int32_t> id_of_config_token(const std::string& token, const std::string& file) const;

  std::shared_ptr<const tok::Pipeline> pipeline_;
  std::optional<int32_t> bos_id_, pad_id_;
  std::vector<int32_t> eos_ids_;
  std::string bos_token_, eos_token_, chat_template_;
  bool add_bos_token_ = false;
};

// Incremental decoding for generation: feed ids one at a time, get back only complete UTF-8 text.
// The concatenation of all pieces (plus flush()) equals Tokenizer::decode of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string step(int32_t id);  // "" while the text so far ends inside a UTF-8 character
  std::string flush();           // emits what is left (an unfinished character becomes U+FFFD)

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> window_;  // ids decoded together (a little context keeps decoders like Strip right)
  size_t emitted_bytes_ = 0;     // bytes of the window's decoding already returned
};

// Encodes `corpus` (line by line, as a data loader would) and returns the throughput in MB/s.
double bench_encode_mb_per_s(const Tokenizer& tokenizer, std::string_view corpus);

}  // namespace lmtune
