// Random token batches and their safetensors file (see token_batches.h).
#include "train/token_batches.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/random.h"
#include "io/safetensors.h"

namespace lmtune {

Batch TokenBatches::batch(int64_t step, int64_t first_row, int64_t rows) const {
  if (step < 0 || step >= steps)
    throw ConfigError("token batches: step " + std::to_string(step) + " of " + std::to_string(steps));
  if (first_row < 0 || rows < 1 || first_row + rows > B)
    throw ConfigError("token batches: rows " + std::to_string(first_row) + ".." + std::to_string(first_row + rows) +
                      " of " + std::to_string(B));
  Batch b;
  b.B = int(rows);
  b.T = int(T);
  const size_t n = size_t(rows * T);
  const auto first = ids.begin() + (step * B + first_row) * T;
  b.ids.assign(first, first + int64_t(n));
  b.targets.assign(n, -100);
  b.positions.assign(n, 0);
  b.doc_ids.assign(n, 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = size_t(r * T + t);
      b.positions[i] = int32_t(t);
      if (t + 1 < T) b.targets[i] = b.ids[i + 1];
    }
  b.trainable_tokens = rows * (T - 1);
  return b;
}

TokenBatches random_token_batches(int64_t vocab, int64_t steps, int64_t B, int64_t T, uint64_t seed) {
  if (vocab < 2 || steps < 1 || B < 1 || T < 2)
    throw ConfigError("token batches: need vocab >= 2, steps >= 1, batch >= 1 and seq >= 2");
  std::vector<double> cdf(static_cast<size_t>(vocab));
  double total = 0;
  for (int64_t k = 0; k < vocab; ++k) cdf[size_t(k)] = total += 1.0 / double(k + 1);
  TokenBatches tb{steps, B, T, std::vector<int32_t>(static_cast<size_t>(steps * B * T))};
  Rng rng(seed * 0x9e3779b97f4a7c15ull + 0x5bd1e995);
  for (int32_t& id : tb.ids) {
    const double u = rng.uniform() * total;
    id = int32_t(std::min<int64_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin(), vocab - 1));
  }
  return tb;
}

void save_token_batches(const std::filesystem::path& file, const TokenBatches& tb) {
  TensorToWrite t{"input_ids", StDType::I32, {tb.steps, tb.B, tb.T},
                  std::as_bytes(std::span<const int32_t>(tb.ids))};
  write_safetensors(file, std::span<const TensorToWrite>(&t, 1), {{"format", "pt"}});
}

TokenBatches load_token_batches(const std::filesystem::path& file, int64_t vocab) {
  SafetensorsFile f(file);
  const SafetensorsTensor* t = f.find("input_ids");
  if (!t) throw FileError(file.string() + ": no tensor 'input_ids' (expected i32 [steps, batch, seq])");
  if (t->st_dtype != StDType::I32 || t->shape.size() != 3 || t->shape[2] < 2)
    throw FileError(file.string() + ": 'input_ids' is " + std::string(st_dtype_name(t->st_dtype)) + " " +
                    to_string(t->shape) + ", expected I32 [steps, batch, seq] with seq >= 2");
  TokenBatches tb{t->shape[0], t->shape[1], t->shape[2], std::vector<int32_t>(static_cast<size_t>(t->numel()))};
  std::memcpy(tb.ids.data(), t->data.data(), tb.ids.size() * sizeof(int32_t));
  for (size_t i = 0; i < tb.ids.size(); ++i)
    if (tb.ids[i] < 0 || tb.ids[i] >= vocab)
      throw FileError(file.string() + ": input_ids holds id " + std::to_string(tb.ids[i]) + " at flat index " +
                      std::to_string(i) + ", outside the model's vocabulary [0, " + std::to_string(vocab) + ")");
  return tb;
}

}  // namespace lmtune
