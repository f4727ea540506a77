// Reverse mode (backward, vjp, value_and_grad), forward mode (jvp) and checkpoint over the recorded graph.
// Nodes are processed in order of their sequence numbers: a node's inputs were always created before it, so
// decreasing seq is a valid reverse topological order and increasing seq a forward one.
#include "core/autodiff.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "core/ops.h"
#include "core/tape.h"

namespace lmtune {
namespace {

thread_local bool t_grad_enabled = true;
thread_local bool t_save_all = false;
thread_local bool t_force = false;
thread_local uint64_t t_seq = 0;

class EnableGrad {
 public:
  EnableGrad() : prev_(t_grad_enabled) { t_grad_enabled = true; }
  ~EnableGrad() { t_grad_enabled = prev_; }

 private:
  bool prev_;
};

Tensor accumulate(const Tensor& acc, const Tensor& g) {
  if (!acc.defined()) return g;
  return ops::add(acc, g.dtype() == acc.dtype() ? g : ops::cast(g, acc.dtype()));
}

bool is_checkpoint(const Primitive& prim);  // defined with CheckpointPrimitive below

std::atomic<uint64_t> g_added_in_place{0};

// Whether a collected gradient may be updated in place by a vjp: the value's own dtype and shape, contiguous, and
// no other tensor (view) shares its memory.
bool in_place_ok(const Tensor& g, DType dtype, const Shape& shape) {
  return g.dtype() == dtype && g.shape() == shape && g.is_contiguous() && g.offset() == 0 &&
         g.impl_ptr().use_count() == 1 && g.buffer() && g.buffer().use_count() == 1;
}

// Nodes reachable from the roots, sorted by seq (ascending). Nodes older than min_seq are not entered.
std::vector<Node*> collect(const std::vector<Tensor>& roots, uint64_t min_seq = 0) {
  std::set<Node*> seen;
  std::vector<Node*> stack, order;
  auto visit = [&](Node* n) {
    if (n->seq >= min_seq && seen.insert(n).second) stack.push_back(n);
  };
  for (const auto& r : roots)
    if (r.defined() && r.impl()->node) visit(r.impl()->node.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    order.push_back(n);
    for (const auto& e : n->edges)
      if (e.node) visit(e.node.get());
  }
  std::sort(order.begin(), order.end(), [](Node* a, Node* b) { return a->seq < b->seq; });
  return order;
}

void check_grad_shape(const Node& node, size_t i, const Tensor& g) {
  if (g.defined() && g.shape() != node.input_shapes[i])
    throw AutodiffError(std::string("vjp of '") + node.prim->name() + "' returned shape " + to_string(g.shape()) +
                        " for input " + std::to_string(i) + " of shape " + to_string(node.input_shapes[i]));
}

// Propagates cotangents from `roots` back through the graph. Returns the gradients of `targets` (zeros where
// unreached). Other leaves that require grad get theirs accumulated into .grad when accumulate_leaves is set.
// Nodes older than min_seq belong to an enclosing graph (checkpoint's recomputation): reaching one is an error.
std::vector<Tensor> run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& cotangents,
                                 const std::vector<Tensor>& targets, bool accumulate_leaves, uint64_t min_seq = 0) {
  NoGrad no_grad;
  std::unordered_map<Node*, std::vector<Tensor>> node_grads;
  std::map<TensorImpl*, Tensor> leaf_grads;
  std::map<TensorImpl*, std::shared_ptr<TensorImpl>> leaf_owner;
  auto add_to_leaf = [&](const std::shared_ptr<TensorImpl>& leaf, const Tensor& g) {
    leaf_grads[leaf.get()] = accumulate(leaf_grads[leaf.get()], g);
    leaf_owner[leaf.get()] = leaf;
  };
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    const Tensor& c = cotangents[i];
    if (!c.defined() || !r.defined()) continue;
    if (c.shape() != r.shape())
      throw AutodiffError("backward: cotangent of shape " + to_string(c.shape()) + " for an output of shape " +
                          to_string(r.shape()));
    if (auto& n = r.impl()->node) {
      auto& slot = node_grads[n.get()];
      slot.resize(n->output_shapes.size());
      slot[r.impl()->output_index] = accumulate(slot[r.impl()->output_index], c);
    } else if (r.requires_grad()) {
      add_to_leaf(r.impl_ptr(), c);
    }
  }
  std::vector<Node*> order = collect(roots, min_seq);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = *it;
    auto found = node_grads.find(node);
    if (found == node_grads.end()) continue;
    if (node->consumed)
      throw AutodiffError(std::string("backward: the graph through op '") + node->prim->name() +
                          "' was already used by an earlier backward pass and released; recompute the forward pass");
    std::vector<Tensor> cots = std::move(found->second);
    node_grads.erase(found);
    cots.resize(node->output_shapes.size());
    std::vector<bool> wanted(node->edges.size());
    bool any = false;
    for (size_t i = 0; i < wanted.size(); ++i) any |= (wanted[i] = node->edges[i].requires_grad());
    // A checkpoint's vjp must run even when none of its inputs requires grad: it accumulates the gradients
    // of the parameters its function captured.
    any = any || is_checkpoint(*node->prim);
    if (any) {
      // Gradients an input has collected so far, where the vjp may add into them in place (Primitive::vjp_into):
      // moved out of their slot, so that only `into` holds them; whatever the vjp does not take goes back.
      std::vector<Tensor> into(node->edges.size());
      std::vector<bool> added(node->edges.size());
      for (size_t i = 0; i < node->edges.size(); ++i) {
        const Edge& e = node->edges[i];
        if (!wanted[i] || !e.node) continue;
        auto found_slot = node_grads.find(e.node.get());
        if (found_slot == node_grads.end() || found_slot->second.size() <= size_t(e.output_index)) continue;
        Tensor& slot = found_slot->second[size_t(e.output_index)];
        if (slot.defined() && in_place_ok(slot, node->input_dtypes[i], node->input_shapes[i]))
          into[i] = std::move(slot);
      }
      std::vector<Tensor> grads = node->prim->vjp_into(*node, cots, wanted, into, added);
      for (size_t i = 0; i < node->edges.size(); ++i) {
        if (!into[i].defined()) continue;
        const Edge& e = node->edges[i];
        Tensor& slot = node_grads[e.node.get()][size_t(e.output_index)];
        slot = into[i];
        if (added[i]) {
          if (i >= grads.size() || grads[i].impl() != into[i].impl())
            throw AutodiffError(std::string("vjp of '") + node->prim->name() + "' added into input " +
                                std::to_string(i) + "'s gradient but returned another tensor");
          grads[i] = Tensor();  // already in the slot
          ++g_added_in_place;
        }
      }
      for (size_t i = 0; i < node->edges.size() && i < grads.size(); ++i) {
        if (!wanted[i] || !grads[i].defined()) continue;
        check_grad_shape(*node, i, grads[i]);
        // Cotangents travel in the dtype of the value they belong to.
        if (grads[i].dtype() != node->input_dtypes[i]) grads[i] = ops::cast(grads[i], node->input_dtypes[i]);
        const Edge& e = node->edges[i];
        if (e.node && e.node->seq < min_seq)
          throw AutodiffError(std::string("checkpoint: the checkpointed function uses the output of op '") +
                              e.node->prim->name() +
                              "', computed outside it, that requires grad; pass such tensors as inputs of the "
                              "checkpointed function (only captured leaves, e.g. parameters, are supported)");
        if (e.node) {
          auto& slot = node_grads[e.node.get()];
          slot.resize(e.node->output_shapes.size());
          slot[e.output_index] = accumulate(slot[e.output_index], grads[i]);
        } else {
          add_to_leaf(e.leaf, grads[i]);
        }
      }
    }
    // The graph is consumed: release what this node kept for its vjp.
    node->inputs.clear();
    node->outputs.clear();
    node->consumed = true;
  }
  std::vector<Tensor> out(targets.size());
  std::set<TensorImpl*> target_set;
  for (size_t i = 0; i < targets.size(); ++i) {
    target_set.insert(targets[i].impl());
    auto f = leaf_grads.find(targets[i].impl());
    out[i] = f != leaf_grads.end() ? f->second : Tensor::zeros(targets[i].shape(), targets[i].dtype(), targets[i].device());
  }
  if (accumulate_leaves) {
    for (auto& [impl, g] : leaf_grads) {
      if (target_set.count(impl)) continue;
      auto& owner = leaf_owner[impl];
      Tensor prev = owner->grad ? Tensor(owner->grad) : Tensor();
      Tensor sum = accumulate(prev, g.dtype() == owner->dtype ? g : ops::cast(g, owner->dtype));
      if (!sum.is_contiguous()) sum = ops::contiguous(sum);
      owner->grad = sum.impl_ptr();
    }
  }
  return out;
}

std::vector<Tensor> fresh_leaves(const std::vector<Tensor>& primals) {
  std::vector<Tensor> leaves;
  for (const auto& p : primals) {
    Tensor l = p.detach();
    if (is_float(l.dtype())) l.set_requires_grad(true);
    leaves.push_back(l);
  }
  return leaves;
}

// An op whose kernels a recomputation put off (Primitive::may_defer).
struct DeferredOp {
  std::shared_ptr<Primitive> prim;
  std::vector<Tensor> inputs, outputs;
};

// Outputs that apply_kept keeps in a checkpointed segment's first pass, handed back in its recomputation; and the
// ops the recomputation deferred, dropped when it returns if nothing read their outputs.
struct KeptOutputs {
  std::vector<std::vector<Tensor>> outputs;
  size_t next = 0;
  bool replay = false;
  std::vector<DeferredOp> deferred;

  void run_deferred() {
    std::vector<DeferredOp> ops = std::move(deferred);
    deferred.clear();
    NoGrad no_grad;
    for (DeferredOp& op : ops) eval_on(op.outputs[0].device(), *op.prim, op.inputs, op.outputs);
  }
};
thread_local KeptOutputs* g_kept = nullptr;
std::atomic<uint64_t> g_deferred_dropped{0};

struct KeptScope {
  KeptOutputs* saved;
  explicit KeptScope(KeptOutputs* k) : saved(g_kept) {
    if (saved) saved->run_deferred();  // a nested segment sees only what has run
    g_kept = k;
  }
  ~KeptScope() { g_kept = saved; }
  KeptScope(const KeptScope&) = delete;
  KeptScope& operator=(const KeptScope&) = delete;
};

bool matches(const std::vector<Tensor>& kept, const std::vector<OutputSpec>& specs) {
  if (kept.size() != specs.size()) return false;
  for (size_t i = 0; i < kept.size(); ++i)
    if (kept[i].shape() != specs[i].shape || kept[i].dtype() != specs[i].dtype) return false;
  return true;
}

// The node that checkpoint() records: its vjp recomputes the segment with recording on.
class CheckpointPrimitive final : public Primitive {
 public:
  CheckpointPrimitive(Fn fn, std::shared_ptr<KeptOutputs> kept) : fn_(std::move(fn)), kept_(std::move(kept)) {}
  const char* name() const override { return "checkpoint"; }
  void eval_cpu(const std::vector<Tensor>&, std::vector<Tensor>&) override {}
  void eval_vulkan(const std::vector<Tensor>&, std::vector<Tensor>&) override {}
  bool has_vjp() const override { return true; }
  bool has_jvp() const override { return true; }

  std::vector<Tensor> vjp(const Node& node, const std::vector<Tensor>& cots, const std::vector<bool>&) override {
    EnableGrad grad_on;
    std::vector<Tensor> leaves = fresh_leaves(node.inputs);
    uint64_t first = tape::next_seq();  // nodes of the recomputation come after this
    std::vector<Tensor> outs;
    {
      kept_->replay = true;
      kept_->next = 0;
      KeptScope scope(kept_.get());
      outs = fn_(leaves);
    }
    // What is still deferred only made the segment's results, which the backward pass below never reads.
    g_deferred_dropped += kept_->deferred.size();
    kept_->deferred.clear();
    std::vector<Tensor> grads = run_backward(outs, cots, leaves, /*accumulate_leaves=*/true, first);
    kept_->outputs.clear();  // freed as the backward walks down the segments
    return grads;
  }
  std::vector<Tensor> jvp(const Node& node, const std::vector<Tensor>& tangents) override {
    EnableGrad grad_on;
    KeptScope none(nullptr);
    return lmtune::jvp(fn_, node.inputs, tangents).second;
  }

 private:
  Fn fn_;
  std::shared_ptr<KeptOutputs> kept_;
};

bool is_checkpoint(const Primitive& prim) { return dynamic_cast<const CheckpointPrimitive*>(&prim) != nullptr; }

}  // namespace

namespace tape {
uint64_t next_seq() { return ++t_seq; }
bool saving_everything() { return t_save_all; }
bool force_record() { return t_force; }

bool defer(const std::shared_ptr<Primitive>& prim, const std::vector<Tensor>& inputs,
           const std::vector<Tensor>& outputs) {
  KeptOutputs* k = g_kept;
  if (!k || !k->replay || !t_grad_enabled || t_save_all || !prim->may_defer() || outputs.empty()) return false;
  if (prim->vjp_needs_inputs()) read_by(inputs);  // before this op joins the deferred ones
  {
    NoGrad no_grad;
    prim->prepare_vjp(inputs);
  }
  k->deferred.push_back({prim, inputs, outputs});
  return true;
}

void read_by(const std::vector<Tensor>& tensors) {
  KeptOutputs* k = g_kept;
  if (!k || k->deferred.empty()) return;
  for (const DeferredOp& op : k->deferred)
    for (const Tensor& out : op.outputs)
      for (const Tensor& t : tensors)
        if (t.defined() && t.buffer() == out.buffer()) return k->run_deferred();
}
Scope::Scope(bool save_everything, bool force) : prev_save_(t_save_all), prev_force_(t_force) {
  t_save_all = save_everything;
  t_force = force;
}
Scope::~Scope() {
  t_save_all = prev_save_;
  t_force = prev_force_;
}
}  // namespace tape

bool grad_enabled() { return t_grad_enabled; }
bool on_tape(const Tensor& t) { return t.defined() && (t.requires_grad() || t.impl()->node); }
NoGrad::NoGrad() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGrad::~NoGrad() { t_grad_enabled = prev_; }

uint64_t gradients_added_in_place() { return g_added_in_place.load(); }
uint64_t recomputed_ops_dropped() { return g_deferred_dropped.load(); }

void backward(const Tensor& loss, const Tensor& cotangent) {
  if (!loss.defined()) throw AutodiffError("backward: undefined tensor");
  Tensor cot = cotangent;
  if (!cot.defined()) {
    if (loss.numel() != 1)
      throw AutodiffError("backward: output of shape " + to_string(loss.shape()) +
                          " is not a scalar; pass a cotangent of that shape");
    cot = Tensor::full(loss.shape(), 1.0f, loss.dtype(), loss.device());
  }
  if (!loss.requires_grad()) throw AutodiffError("backward: the output does not depend on any tensor that requires grad");
  run_backward({loss}, {cot}, {}, /*accumulate_leaves=*/true);
}

std::pair<std::vector<Tensor>, std::vector<Tensor>> vjp(const Fn& f, const std::vector<Tensor>& primals,
                                                        const std::vector<Tensor>& cotangents) {
  std::vector<Tensor> leaves = fresh_leaves(primals);
  std::vector<Tensor> outs;
  {
    EnableGrad grad_on;
    outs = f(leaves);
  }
  if (cotangents.size() != outs.size())
    throw AutodiffError("vjp: " + std::to_string(cotangents.size()) + " cotangents for " + std::to_string(outs.size()) +
                        " outputs");
  std::vector<Tensor> grads = run_backward(outs, cotangents, leaves, /*accumulate_leaves=*/false);
  for (auto& o : outs) o = o.detach();
  return {outs, grads};
}

std::pair<std::vector<Tensor>, std::vector<Tensor>> jvp(const Fn& f, const std::vector<Tensor>& primals,
                                                        const std::vector<Tensor>& tangents) {
  if (tangents.size() != primals.size())
    throw AutodiffError("jvp: " + std::to_string(tangents.size()) + " tangents for " + std::to_string(primals.size()) +
                        " primals");
  std::vector<Tensor> leaves = fresh_leaves(primals);
  std::vector<Tensor> outs;
  {
    EnableGrad grad_on;
    tape::Scope keep_all(/*save_everything=*/true, /*force_record=*/false);
    outs = f(leaves);
  }
  NoGrad no_grad;
  std::map<TensorImpl*, Tensor> leaf_tangent;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (tangents[i].defined() && tangents[i].shape() != primals[i].shape())
      throw AutodiffError("jvp: tangent " + std::to_string(i) + " has shape " + to_string(tangents[i].shape()) +
                          ", primal has " + to_string(primals[i].shape()));
    leaf_tangent[leaves[i].impl()] = tangents[i];
  }
  std::unordered_map<Node*, std::vector<Tensor>> node_tangents;
  for (Node* node : collect(outs)) {
    std::vector<Tensor> in_t(node->edges.size());
    bool any = false;
    for (size_t i = 0; i < node->edges.size(); ++i) {
      const Edge& e = node->edges[i];
      if (e.node) {
        auto f2 = node_tangents.find(e.node.get());
        if (f2 != node_tangents.end()) in_t[i] = f2->second[e.output_index];
      } else if (e.leaf) {
        auto f2 = leaf_tangent.find(e.leaf.get());
        if (f2 != leaf_tangent.end()) in_t[i] = f2->second;
      }
      any |= in_t[i].defined();
    }
    if (!any) continue;
    if (!node->prim->has_jvp()) throw AutodiffError(std::string("op '") + node->prim->name() + "' has no jvp");
    std::vector<Tensor> out_t = node->prim->jvp(*node, in_t);
    out_t.resize(node->output_shapes.size());
    node_tangents[node] = std::move(out_t);
  }
  std::vector<Tensor> result(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    const Tensor& o = outs[i];
    if (o.impl()->node) {
      auto f2 = node_tangents.find(o.impl()->node.get());
      if (f2 != node_tangents.end()) result[i] = f2->second[o.impl()->output_index];
    } else if (auto f2 = leaf_tangent.find(o.impl()); f2 != leaf_tangent.end()) {
      result[i] = f2->second;
    }
    if (!result[i].defined()) result[i] = Tensor::zeros(o.shape(), o.dtype(), o.device());
    outs[i] = o.detach();
  }
  return {outs, result};
}

std::function<std::pair<Tensor, std::vector<Tensor>>(const std::vector<Tensor>&)> value_and_grad(const Fn& f) {
  return [f](const std::vector<Tensor>& args) {
    std::vector<Tensor> leaves = fresh_leaves(args);
    Tensor value;
    {
      EnableGrad grad_on;
      auto outs = f(leaves);
      if (outs.empty() || outs[0].numel() != 1)
        throw AutodiffError("value_and_grad: the function must return a scalar first");
      value = outs[0];
    }
    Tensor one = Tensor::full(value.shape(), 1.0f, value.dtype(), value.device());
    std::vector<Tensor> grads = run_backward({value}, {one}, leaves, /*accumulate_leaves=*/false);
    return std::make_pair(value.detach(), grads);
  };
}

Fn checkpoint(Fn f) {
  return [f](const std::vector<Tensor>& inputs) -> std::vector<Tensor> {
    if (!grad_enabled()) return f(inputs);
    std::vector<Tensor> outs;
    auto kept = std::make_shared<KeptOutputs>();
    {
      NoGrad no_grad;  // no intermediates are kept (but apply_kept's): backward recomputes them
      KeptScope scope(kept.get());
      outs = f(inputs);
    }
    for (auto& o : outs) o = o.detach();
    tape::Scope force(tape::saving_everything(), /*force_record=*/true);
    return record(std::make_shared<CheckpointPrimitive>(f, std::move(kept)), inputs, std::move(outs));
  };
}

std::vector<Tensor> apply_kept(std::shared_ptr<Primitive> prim, const std::vector<Tensor>& inputs,
                               const std::vector<OutputSpec>& outputs) {
  KeptOutputs* k = g_kept;
  if (k && k->replay && k->next < k->outputs.size() && matches(k->outputs[k->next], outputs))
    return record(std::move(prim), inputs, k->outputs[k->next++]);
  std::vector<Tensor> outs = apply(std::move(prim), inputs, outputs);
  if (k && !k->replay) k->outputs.push_back(outs);
  return outs;
}

}  // namespace lmtune
