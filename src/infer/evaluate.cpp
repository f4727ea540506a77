// Evaluation loss and generation metrics (see evaluate.h).
#include "infer/evaluate.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "data/batcher.h"
#include "infer/generator.h"

namespace lmtune::infer {

LossResult evaluate_loss(const models::Decoder& decoder, const Dataset& dataset, int batch_size, int seq_len,
                         bool packing, int max_batches) {
  NoGrad no_grad;
  const Device dev = decoder.device();
  Batcher batcher(dataset, batch_size, seq_len, packing, /*seed=*/0, /*shuffle=*/false);
  LossResult r;
  double total = 0;
  // Target rows per loss call. The fused loss bounds its own memory (vocabulary chunks) and reads lm_head once
  // per call, so it takes every row of a batch at once; the unfused reference (DecoderPaths) materialises
  // [rows, V] f32 logits, so it goes 64 MiB of logits at a time (e.g. 110 rows of a 152k vocabulary).
  const bool fused = decoder.paths().fused_loss;
  const int64_t reference_rows = std::max<int64_t>(1, (int64_t(64) << 20) / (4 * decoder.config().vocab_size));
  while (!batcher.epoch_finished() && (max_batches <= 0 || r.batches < max_batches)) {
    Batch b = batcher.next();
    if (b.B == 0) break;
    ++r.batches;
    if (b.trainable_tokens == 0) continue;
    const int64_t B = b.B, T = b.T, C = decoder.config().hidden_size;
    models::ForwardOptions opt;
    opt.doc_ids = Tensor::from_ints(b.doc_ids, {B, T}, dev);
    Tensor hidden = decoder.forward_hidden(Tensor::from_ints(b.ids, {B, T}, dev),
                                           Tensor::from_ints(b.positions, {B, T}, dev), opt);
    hidden = ops::reshape(ops::contiguous(hidden), {B * T, C});
    // Gather the rows that have a target (embedding() is a row gather), then lm_head + cross-entropy.
    std::vector<int32_t> rows, targets;
    for (size_t i = 0; i < b.targets.size(); ++i)
      if (b.targets[i] != -100) {
        rows.push_back(int32_t(i));
        targets.push_back(b.targets[i]);
      }
    const int64_t chunk = fused ? std::max<int64_t>(1, int64_t(rows.size())) : reference_rows;
    for (size_t first = 0; first < rows.size(); first += size_t(chunk)) {
      const int64_t n = std::min<int64_t>(chunk, int64_t(rows.size() - first));
      Tensor idx = Tensor::from_ints({rows.begin() + std::ptrdiff_t(first), rows.begin() + std::ptrdiff_t(first) + n}, {n}, dev);
      Tensor tgt = Tensor::from_ints({targets.begin() + std::ptrdiff_t(first), targets.begin() + std::ptrdiff_t(first) + n}, {n}, dev);
      total += double(ops::sum_all(decoder.token_losses(ops::embedding(hidden, idx), tgt)).item());
    }
    r.tokens += int64_t(rows.size());
  }
  r.loss = r.tokens > 0 ? total / double(r.tokens) : 0;
  return r;
}

std::vector<PromptCompletion> read_prompt_completions(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw FileError(file.string() + ": cannot open");
  std::vector<PromptCompletion> out;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json obj;
    try {
      obj = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // parse_error, out_of_range (1e400)
      throw FileError(file.string() + ":" + std::to_string(n) + ": invalid JSON: " + e.what());
    }
    if (!obj.is_object() || !obj.contains("prompt") || !obj.contains("completion") || !obj["prompt"].is_string() ||
        !obj["completion"].is_string()) {
      if (out.empty()) return {};
      throw FileError(file.string() + ":" + std::to_string(n) + ": expected string \"prompt\" and \"completion\"");
    }
    out.push_back({obj["prompt"].get<std::string>(), obj["completion"].get<std::string>()});
  }
  return out;
}

std::string strip(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  size_t a = s.find_first_not_of(ws);
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(ws) - a + 1);
}

GenerationMetrics evaluate_generation(const models::Decoder& decoder, const Tokenizer& tokenizer,
                                      const std::vector<PromptCompletion>& examples, int batch_size) {
  GenerationMetrics m;
  if (examples.empty()) return m;
  std::vector<Sequence> seqs;
  seqs.reserve(examples.size());
  for (const auto& ex : examples) {
    StopParams stop;
    stop.max_tokens = int(tokenizer.encode(ex.completion, false).size()) + 16;
    stop.stop_ids = tokenizer.eos_ids();
    seqs.emplace_back(tokenizer.encode(ex.prompt, true), SamplingParams{}, stop, &tokenizer);
  }
  generate(decoder, seqs, batch_size);
  int64_t exact = 0, contains = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    std::string want = strip(examples[i].completion), got = seqs[i].text();
    exact += strip(got) == want;
    contains += got.find(want) != std::string::npos;
  }
  m.examples = int64_t(examples.size());
  m.exact_match = double(exact) / double(m.examples);
  m.contains = double(contains) / double(m.examples);
  return m;
}

}  // namespace lmtune::infer
