// Training and evaluation data: JSONL in three formats tokenized into samples with a loss mask, cached in HDF5.
//   {"text": ...}                       loss on every token (an EOS is appended)
//   {"prompt": ..., "completion": ...}  loss on the completion (and its EOS) only
//   {"messages": [{"role", "content"}]} the model's chat template; loss on assistant turns only
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace lmtune {

class Tokenizer;
class ChatTemplate;

struct Sample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trainable;  // trainable[i] = 1: token i is a prediction target (predicted from i - 1)
};

struct DatasetStats {
  int64_t lines = 0;             // non-blank lines read
  int64_t samples = 0;           // kept
  int64_t tokens = 0;            // in kept samples
  int64_t trainable_tokens = 0;
  int64_t truncated = 0;         // over-long samples cut to max_seq_len
  int64_t dropped_overlong = 0;  // over-long samples dropped (overlong: drop)
  int64_t rejected_untrainable = 0;  // samples with no trainable token
  std::string format;            // the format detected or given
};

struct DataOptions {
  std::string format = "auto";       // auto | text | completion | chat
  int max_seq_len = 1024;
  std::string overlong = "truncate"; // truncate | drop | error
};

struct Dataset {
  std::vector<Sample> samples;
  DatasetStats stats;
  std::string hash;  // of data file, tokenizer and options: names the cache and goes into checkpoints
};

// Reads and tokenizes a JSONL file. Malformed lines throw FileError("<file>:<line>: ..."). When cache_dir is
// non-empty, the tokenized result is cached there in HDF5 (tokenized-<hash>.h5) and reused on the next call.
Dataset load_dataset(const std::filesystem::path& file, const Tokenizer& tokenizer, const DataOptions& options,
                     const std::filesystem::path& cache_dir = {});

// A hash of a data file's text, the tokenizer (its vocabulary, specials, chat template and pipeline) and the
// settings that shape the samples: names token caches and goes into checkpoints.
std::string data_hash(const std::string& file_text, const Tokenizer& tokenizer, const std::string& settings);

// Tokenizes one JSONL line (from `where`, e.g. "train.jsonl:12"). format "auto" is replaced by the format
// detected. `chat` is the parsed chat template (parsed on demand when null). Throws FileError for bad lines.
Sample tokenize_record(const std::string& json_line, const Tokenizer& tokenizer, std::string& format,
                       const std::string& where, const ChatTemplate* chat = nullptr);

}  // namespace lmtune
