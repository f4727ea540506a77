// Reverse- and forward-mode automatic differentiation over recorded ops, MLX-style function transforms,
// and gradient checkpointing. See docs/autodiff.md.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "core/primitive.h"

namespace lmtune {

// Where an op input came from: another node's output, or a leaf tensor that requires grad.
struct Edge {
  std::shared_ptr<Node> node;         // producing node, or null for a leaf
  int output_index = 0;
  std::shared_ptr<TensorImpl> leaf;   // set for leaves that require grad
  bool requires_grad() const { return node || leaf; }
};

// One recorded op application.
struct Node {
  std::shared_ptr<Primitive> prim;
  std::vector<Edge> edges;              // one per input
  std::vector<Shape> input_shapes;
  std::vector<DType> input_dtypes;
  std::vector<Tensor> inputs;           // detached saved inputs (undefined when the vjp does not need them)
  std::vector<Tensor> outputs;          // detached saved outputs (likewise)
  std::vector<Shape> output_shapes;
  std::vector<DType> output_dtypes;
  uint64_t seq = 0;                     // creation order: a node's inputs always have smaller seq
  bool consumed = false;                // backward ran through it and released the saved tensors
};

// Gradient recording is on by default; NoGrad turns it off for a scope (evaluation, optimizer updates).
bool grad_enabled();
// Whether reverse mode can reach t: it requires grad, or a recorded op produced it.
bool on_tape(const Tensor& t);
class NoGrad {
 public:
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool prev_;
};

// Accumulates d(loss)/d(leaf) into leaf.grad() for every leaf that requires grad. `loss` must be a scalar
// unless a cotangent of its shape is given. The graph is released as it is consumed.
void backward(const Tensor& loss, const Tensor& cotangent = Tensor());
// How many input gradients backward passes have had added in place by the vjp that produced them
// (Primitive::vjp_into) instead of by an add of their own, since the program started (for tests).
uint64_t gradients_added_in_place();
// How many ops checkpoints' recomputations deferred and then dropped because nothing read their outputs
// (Primitive::may_defer), since the program started (for tests).
uint64_t recomputed_ops_dropped();

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Returns (f(primals), J^T cotangents), the latter one per primal.
std::pair<std::vector<Tensor>, std::vector<Tensor>> vjp(const Fn& f, const std::vector<Tensor>& primals,
                                                        const std::vector<Tensor>& cotangents);
// Returns (f(primals), J tangents), the latter one per output.
std::pair<std::vector<Tensor>, std::vector<Tensor>> jvp(const Fn& f, const std::vector<Tensor>& primals,
                                                        const std::vector<Tensor>& tangents);
// f returns a scalar first; value_and_grad(f)(args) gives (f(args), d f / d args).
std::function<std::pair<Tensor, std::vector<Tensor>>(const std::vector<Tensor>&)> value_and_grad(const Fn& f);

// Gradient checkpointing: the returned function computes f without keeping its intermediates; backward
// recomputes them from the saved inputs. Tensors captured by f that require grad receive gradients too. The
// recomputation skips the kernels of ops whose outputs nothing reads (Primitive::may_defer): only cotangents
// flow through f's results there.
Fn checkpoint(Fn f);

// Selective recomputation: inside a function run by checkpoint(), apply_kept runs a primitive in the first pass
// and keeps its outputs; backward's recomputation records the kept outputs (in call order) instead of running it
// again, and frees them once that segment's backward is done. Elsewhere it is apply(). For ops that cost far more
// to recompute than to keep: the fused attention keeps O and LSE (B·T·H·(D + 2) values per layer).
std::vector<Tensor> apply_kept(std::shared_ptr<Primitive> prim, const std::vector<Tensor>& inputs,
                               const std::vector<OutputSpec>& outputs);

}  // namespace lmtune
