// Thread-local recording state shared by apply() and the autodiff transforms (internal to src/core).
#pragma once
#include <cstdint>

namespace lmtune::tape {

uint64_t next_seq();
// jvp tracing keeps every input and output so each node's jvp can run afterwards.
bool saving_everything();
// checkpoint() records its node even when no explicit input requires grad (captured parameters may).
bool force_record();

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
