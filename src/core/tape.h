// Thread-local recording state shared by apply() and the autodiff transforms (internal to src/core).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace lmtune {
class Primitive;
}

namespace lmtune::tape {

uint64_t next_seq();
// jvp tracing keeps every input and output so each node's jvp can run afterwards.
bool saving_everything();
// checkpoint() records its node even when no explicit input requires grad (captured parameters may).
bool force_record();

// Kernels deferred in a checkpointed segment's recomputation (Primitive::may_defer). defer: whether apply should
// record the op without running it (it then runs prepare_vjp, and keeps the kernels for later). read_by: before
// kernels or the host read `tensors`, runs every deferred op, in order, if one of them shares a buffer with a
// deferred output.
bool defer(const std::shared_ptr<Primitive>& prim, const std::vector<Tensor>& inputs,
           const std::vector<Tensor>& outputs);
void read_by(const std::vector<Tensor>& tensors);

class Scope {  // sets the two flags above for its lifetime
 public:
  Scope(bool save_everything, bool force_record);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool prev_save_, prev_force_;
};

}  // namespace lmtune::tape
