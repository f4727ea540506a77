// Internal building blocks of the tokenizer pipeline (HF `tokenizers` components): normalizers, pre-tokenizers,
// the BPE model, post-processors, decoders and the added-token splitter. Each is built from its tokenizer.json
// object by a make_* factory that throws FileError naming the file, the JSON path and the problem.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lmtune::tok {

using json = nlohmann::json;

// Hash map keyed by std::string that can be probed with a string_view without allocating.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Where a component comes from, for error messages: "tokenizer.json: pre_tokenizer.pretokenizers[0]: ...".
struct Origin {
  std::string file;
  std::string path;
  Origin at(const std::string& key) const { return {file, path.empty() ? key : path + "." + key}; }
  Origin at(size_t index) const { return {file, path + "[" + std::to_string(index) + "]"}; }
  [[noreturn]] void fail(const std::string& problem) const;
};

// Ids index dense per-id tables: one past any real vocabulary (2^24, config.json's vocab_size limit) is a
// corrupt file, and one past 2^31 would wrap to another token.
constexpr int64_t kMaxTokenId = (int64_t(1) << 24) - 1;
// A JSON token id in [0, kMaxTokenId]; otherwise origin.fail naming `what` (the token or key).
int32_t token_id(const json& v, const Origin& origin, const std::string& what);

// ---- Regex (PCRE2, UTF + UCP, JIT) -------------------------------------------------------------------------
class Regex {
 public:
  // literal=true matches the pattern text verbatim (HF {"String": ...} patterns).
  Regex(const std::string& pattern, bool literal, const Origin& origin);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Calls on_match(start, end) for every non-overlapping match, left to right.
  template <class F>
  void for_each_match(std::string_view text, F&& on_match) const {
    size_t pos = 0;
    size_t start = 0, end = 0;
    while (pos <= text.size() && next_match(text, pos, start, end)) {
      on_match(start, end);
      pos = end > start ? end : end + 1;  // step past an empty match (by one byte; patterns here never match empty)
    }
  }
  std::string replace_all(std::string_view text, std::string_view replacement) const;

 private:
  bool next_match(std::string_view text, size_t from, size_t& start, size_t& end) const;
  void* code_ = nullptr;  // pcre2_code*
};
// The regex a json {"String": s} or {"Regex": r} pattern object describes.
std::unique_ptr<Regex> make_pattern(const json& pattern, const Origin& origin);

// ---- Normalizers -----------------------------------------------------------------------------------------------
struct Normalizer {
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};
std::unique_ptr<Normalizer> make_normalizer(const json& j, const Origin& origin);  // null json → nullptr

// ---- Pre-tokenizers --------------------------------------------------------------------------------------------
struct PreTokenizer {
  virtual ~PreTokenizer() = default;
  // Splits each piece further (and may rewrite it). `at_start` tells whether the first piece starts at offset 0
  // of the original input (Metaspace's prepend_scheme "first").
  virtual void pre_tokenize(std::vector<std::string>& pieces, bool at_start) const = 0;
};
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const Origin& origin);

// ---- BPE model -------------------------------------------------------------------------------------------------
class Bpe {
 public:
  Bpe(const json& model, const Origin& origin);
  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  // Vocabulary (model vocab only; added tokens live in Pipeline).
  const StringMap<int32_t>& vocab() const { return vocab_; }
  // The merges as (left id, right id), highest priority first (for writing the model out, e.g. as GGUF).
  std::vector<std::pair<int32_t, int32_t>> ranked_merges() const;
  bool byte_fallback() const { return byte_fallback_; }
  bool ignore_merges() const { return ignore_merges_; }
  std::optional<int32_t> unk_id() const { return unk_id_; }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_cached(std::string_view word, std::vector<int32_t>& out) const;
  StringMap<int32_t> vocab_;
  // SentencePiece-style BPE (no pre-tokenizer) sees whole sentences as one word. When no merge can join a
  // character to a following "▁", the word can be cut before each "▁" without changing the result, which
  // makes the word cache effective. These are the characters after which a merge does cross a "▁".
  bool split_before_metaspace_ = false;
  std::vector<std::string> metaspace_joiners_;
  // (left id, right id) → (rank, merged id)
  struct Merge { int32_t rank; int32_t id; };
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int32_t byte_ids_[256];  // ids of <0xXX> tokens, -1 when absent
  // word → ids cache (HF keeps one too); words longer than kMaxCachedWord are not cached.
  static constexpr size_t kMaxCachedWord = 256, kMaxCacheEntries = 200000;
  mutable std::mutex cache_mutex_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

// ---- Post-processors -------------------------------------------------------------------------------------------
struct PostProcessor {
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids) const = 0;  // single sequence, add_special_tokens=true
};
// token_id resolves token strings named by the processor (RobertaProcessing) and checks they exist.
std::unique_ptr<PostProcessor> make_post_processor(const json& j, const Origin& origin);

// ---- Decoders --------------------------------------------------------------------------------------------------
struct Decoder {
  virtual ~Decoder() = default;
  // Rewrites the token strings (HF decode_chain). `streaming` keeps an unfinished UTF-8 byte sequence at the very
  // end as raw bytes instead of replacing it, so StreamDecoder can wait for the rest of the character.
  virtual void decode_chain(std::vector<std::string>& tokens, bool streaming) const = 0;
};
std::unique_ptr<Decoder> make_decoder(const json& j, const Origin& origin);

// ---- Added tokens ----------------------------------------------------------------------------------------------
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Finds added tokens in text: leftmost match, longest first at a position (HF uses leftmost-longest
// Aho-Corasick), honouring single_word / lstrip / rstrip.
class AddedTokenMatcher {
 public:
  void add(const std::string& pattern, const AddedToken& token);
  bool empty() const { return nodes_.size() <= 1; }
  struct Segment {
    std::string_view text;  // a slice of the input
    int32_t token_id;       // -1 for ordinary text
  };
  std::vector<Segment> split(std::string_view text) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                        // index into tokens_ when a pattern ends here
  };
  std::vector<Node> nodes_{1};
  std::vector<AddedToken> tokens_;
};

// ---- The whole pipeline ----------------------------------------------------------------------------------------
struct Pipeline {
  std::string name;  // file name for messages
  // The tokenizer.json objects the normalizer and pre-tokenizer were built from (null when absent), kept so a
  // writer (gguf_vocab.cpp) can tell which llama.cpp pre-tokenizer they amount to.
  json normalizer_spec, pre_tokenizer_spec;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Bpe> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  std::vector<std::string> id_to_token;  // vocab + added tokens
  std::vector<uint8_t> special;          // per id: 1 when an added special token
  std::vector<uint8_t> added;            // per id: 1 when an added token
  StringMap<int32_t> added_ids;
  AddedTokenMatcher raw_matcher;         // added tokens with normalized=false, matched on the raw input
  AddedTokenMatcher normalized_matcher;  // normalized=true ones, matched after normalization

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Decoded bytes (possibly invalid UTF-8 when streaming); decode() makes them valid.
  std::string decode_bytes(const std::vector<int32_t>& ids, bool skip_special_tokens, bool streaming) const;
};

// ---- UTF-8 helpers (utf8.cpp) ----------------------------------------------------------------------------------
// Decodes the code point at text[i] and advances i; malformed bytes decode as U+FFFD, one byte at a time.
char32_t next_code_point(std::string_view text, size_t& i);
void append_utf8(std::string& out, char32_t cp);
size_t utf8_char_length(unsigned char lead);  // 1..4; 1 for a stray continuation/invalid byte
// Length of the longest prefix of `bytes` that does not end inside an unfinished (but so far valid) character.
size_t complete_utf8_prefix(std::string_view bytes);
// Replaces invalid sequences with U+FFFD (maximal-subpart rule, as Rust's from_utf8_lossy).
std::string to_valid_utf8(std::string_view bytes);
bool is_valid_utf8(std::string_view bytes);
bool is_unicode_whitespace(char32_t cp);
// GPT-2 byte ↔ printable-character table used by ByteLevel.
const std::string& byte_to_unicode(unsigned char byte);        // UTF-8 of the stand-in character
int unicode_to_byte(char32_t cp);                              // -1 when cp is not a stand-in

}  // namespace lmtune::tok
