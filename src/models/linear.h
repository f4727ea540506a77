// A linear layer with LoRA slots: the frozen base weight (+ bias) of an HF module and a list of low-rank
// adapters, y = x Wᵀ + b + Σ scale · (x Aᵀ) Bᵀ. Every projection of the decoder (q/k/v/o, gate/up/down) is one.
// The base weight never requires grad; adapters' A and B do when they are being trained.
// Serving batches requests that use different adapters: a RowAdapters then picks one adapter per batch row.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/quant.h"
#include "core/tensor.h"

namespace lmtune::models {

struct LoraAdapter {
  std::string name = "default";
  Tensor A;           // [R, in]
  Tensor B;           // [out, R]; zero at initialisation so an untrained adapter changes nothing
  float scale = 1.0f; // alpha / R (or alpha / sqrt(R) for rsLoRA); the caller decides
  float dropout = 0;  // dropout on the adapter input (x before A, as PEFT) while a LoraDropoutScope is active
  uint64_t dropout_key = 0;  // distinguishes this adapter's dropout masks (the trainer sets its module index)
};

// Training-time LoRA dropout. While a scope is alive on this thread, adapters with dropout > 0 multiply their
// input by a Bernoulli(1 - p) / (1 - p) mask drawn from (seed, step, micro, adapter.dropout_key): a pure
// function of those numbers, so a checkpointed layer recomputed in backward draws the same mask. Outside a scope
// (evaluation, generation) dropout is off.
struct LoraDropoutScope {
  LoraDropoutScope(uint64_t seed, uint64_t step, uint64_t micro);
  ~LoraDropoutScope();
  LoraDropoutScope(const LoraDropoutScope&) = delete;
  LoraDropoutScope& operator=(const LoraDropoutScope&) = delete;
};

// Which adapter each row of a batch uses (serving: one request per row, each with its own adapter or none).
// Rows [begin, end) of a group use only the adapter called `name`; rows outside every group use the base weights
// alone. Groups are sorted by begin and do not overlap; contiguous groups keep the batched step free of gathers.
struct RowAdapters {
  struct Group {
    std::string name;
    int64_t begin = 0, end = 0;
  };
  std::vector<Group> groups;
  // Every row's slot for the products by id on the device, per list of slot names, batch and rows per batch
  // entry (the key): made once while these groups hold, not once per projection and step.
  mutable std::map<std::string, Tensor> slot_ids;
};

// Adapters' factors stacked for products by id (serving, each row its own adapter): slot s holds the adapters
// named names[s] — A [R, in] rows with each scale folded in, B [out, R] — and the last slot zeros (rows without
// an adapter); R the largest slot's rank rounded up to 8 (the products' 16-byte loads), zeros past each slot's.
// A projection group's slot holds its parts' adapters of that name side by side: their A rows one after another,
// their B blocks on the diagonal (each at its part's output rows). Kept while the adapters hold the same tensors
// and scales (inference does not change their values).
struct AdapterStack {
  std::vector<std::string> names;
  std::vector<Tensor> sources;  // every adapter's A and B, part by part (held: their identity is the key)
  std::vector<float> scales;
  Tensor a, b;                  // [S, R, in], [S, out, R]
};

class Linear {
 public:
  Linear() = default;
  Linear(Tensor weight, Tensor bias = Tensor()) : weight(std::move(weight)), bias(std::move(bias)) {}

  // Whether the model has this projection (dense or quantized weight).
  bool present() const { return weight.defined() || qweight.defined(); }
  int64_t in_features() const { return qweight.defined() ? qweight.cols() : weight.dim(1); }
  int64_t out_features() const { return qweight.defined() ? qweight.rows() : weight.dim(0); }

  // x [..., in] -> [..., out] in x's dtype; weights stay in their own dtype (matmul mixes dtypes).
  Tensor operator()(const Tensor& x) const;
  // With `rows` (x [B, ...]): each group of rows gets only its own adapter's delta; rows outside the groups and
  // groups naming an adapter this linear does not have get the base product alone. Null: as above.
  Tensor operator()(const Tensor& x, const RowAdapters* rows) const;
  // residual + (*this)(x, rows) (the decoder's residual stream): where the product can take the sum in its
  // epilogue (ops::matmul_add; Vulkan's decode gemv), no add pass of its own.
  Tensor add_to(const Tensor& residual, const Tensor& x, const RowAdapters* rows = nullptr) const;

  // Adds an adapter of rank R: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform as PEFT), B = 0, both f32 on
  // the weight's device and requiring grad. Returns it.
  LoraAdapter& add_adapter(int64_t rank, float scale, uint64_t seed, const std::string& name = "default");
  // W + Σ scale · B A in the weight's dtype (for export of merged weights); f32 for a quantized weight (decoded).
  Tensor merged_weight() const;
  // Where the layer lives (the weight's device, quantized or not).
  Device device() const;

  Tensor weight;    // [out, in]; undefined when the frozen weight is quantized
  quant::QuantizedTensor qweight;  // [out, in] in a block-quantized format (QLoRA, GGUF), or undefined
  Tensor weight_t;  // [in, out]: the frozen weight stored transposed too, or undefined (see train.transposed_weights;
                    // never with qweight)
  Tensor bias;      // [out] or undefined
  std::vector<LoraAdapter> adapters;

 private:
  friend class LinearGroup;
  // x Wᵀ + b: the dense product, or the quantized one (ops::quantized_linear) where qweight is set.
  Tensor base(const Tensor& x) const;
  // x Wᵀ + b + s (x Aᵀ) Bᵀ (+ residual) of a dense weight with at most one adapter `a` (or none) when nothing is
  // recorded for autodiff (generation, serving): the adapter's delta and the bias or the residual taken inside
  // the base product (ops::matmul_low_rank, ops::matmul_add; on Vulkan's decode gemv, two dispatches with an
  // adapter, one without), the adapter's f32 factors read as stored.
  Tensor fused(const Tensor& x, const LoraAdapter* a, const Tensor& residual) const;
  // x Wᵀ + b + each row's own adapter's delta where `rows` mix adapters (serving) and nothing is recorded for
  // autodiff, for at most kByIdRows rows: the deltas of every row at once, each row taking its adapter's factors
  // from stacks of them by id (ops::matmul_by_id: two dispatches however many adapters); undefined elsewhere.
  Tensor by_row_ids(const Tensor& x, const RowAdapters& rows) const;
  // Only the deltas of by_row_ids (undefined where it does not apply); `whole_batch` also takes one group
  // covering every row (which alone the fused product does better).
  Tensor by_row_ids_delta(const Tensor& x, const RowAdapters& rows, bool whole_batch) const;
  // Whether a group of `rows` names one of this layer's adapters.
  bool named_in(const RowAdapters& rows) const;
  static constexpr int64_t kByIdRows = 64;

  const AdapterStack& adapter_stack() const;  // this layer's adapters, one slot each (kept while current)
  mutable std::shared_ptr<const AdapterStack> stack_;
};

// Several Linears over one input as one product, for inference (models::fuse_projections): q, k and v, or gate
// and up. Decoding then runs one matrix-vector product where it ran one per part (each is a dispatch whose fixed
// cost exceeds its work at small widths). The parts' weights and biases become row blocks of the group's (views:
// nothing is held twice). Their adapters (at most one each, all of one name) are fused on first use into
// A [ΣR, in] (each part's rows scaled by its scale) and a block-diagonal B [Σout, ΣR], kept while the parts hold
// the same adapter tensors; their values must not change meanwhile (inference does not train).
class LinearGroup {
 public:
  LinearGroup() = default;
  // Fuses the parts' dense weights; stays undefined (the parts unchanged) when they cannot be: a quantized part,
  // different dtypes, devices or input sizes, or a bias on some parts only.
  explicit LinearGroup(const std::vector<Linear*>& parts);
  bool defined() const { return weight_.defined(); }
  // Each part's output [..., out_i] for x [..., in] (the parts this group was made from, in order): views of one
  // product where the group applies, else each part's own product. It applies where nothing is recorded for
  // autodiff and
  // - without `rows`, to at most kRows rows whose parts' adapters fuse (decoding);
  // - with `rows` (serving), to at most Linear::kByIdRows rows: the parts' base products as one, plus each row's
  //   adapter deltas of every part at once (the parts' adapters stacked per name: two products by id).
  // `whole`, where given, receives that one product [..., Σout] (undefined where the group does not apply).
  std::vector<Tensor> operator()(const std::vector<const Linear*>& parts, const Tensor& x,
                                 const RowAdapters* rows = nullptr, Tensor* whole = nullptr) const;
  // act(gate) * up of a group made of (gate, up), in that order, where it applies: one product with the
  // activation in its epilogue (ops::matmul_gated: one dispatch in decoding); undefined elsewhere (the caller
  // takes the parts' products).
  Tensor gated(const Linear& gate, const Linear& up, const Tensor& x, ops::GateActivation act,
               const RowAdapters* rows = nullptr) const;
  static constexpr int64_t kRows = 4;

 private:
  // Whether one product of the group's weight stands for the parts' on x (setting `a` to their fused adapter).
  bool applies(const std::vector<const Linear*>& parts, const Tensor& x, const RowAdapters* rows,
               const LoraAdapter*& a) const;
  // With `rows`: every row's delta [..., Σout] by id from the parts' adapters stacked per name (undefined where
  // no group names one); false where the deltas cannot be taken so.
  bool row_deltas(const std::vector<const Linear*>& parts, const Tensor& x, const RowAdapters& rows,
                  Tensor& delta) const;
  // The parts' adapters as one into `out` (null when no part has one); false when they cannot be fused.
  bool fused_adapter(const std::vector<const Linear*>& parts, const LoraAdapter*& out) const;

  Tensor weight_, bias_;  // [Σout, in], [Σout] or undefined
  std::vector<int64_t> outs_;
  struct AdapterCache {
    std::vector<Tensor> sources;  // each part's A and B (undefined: no adapter)
    LoraAdapter fused;
  };
  mutable AdapterCache cache_;
  mutable std::shared_ptr<const AdapterStack> row_stack_;  // the parts' adapters for row_deltas
};

}  // namespace lmtune::models
