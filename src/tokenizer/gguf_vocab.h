// A tokenizer as GGUF metadata (tokenizer.ggml.* and tokenizer.chat_template), the keys llama.cpp's
// convert_hf_to_gguf.py writes and llama.cpp reads; Tokenizer::from_gguf (gguf_vocab.cpp) reads them back.
#pragma once
#include <cstdint>

#include "io/gguf.h"
#include "tokenizer/tokenizer.h"

namespace lmtune {

// The keys for `tokenizer` in a model with `vocab_size` embedding rows: byte-level BPE as model "gpt2" (tokens,
// token types, merges, and the tokenizer.ggml.pre that names its pre-tokenizer), SentencePiece-style BPE (byte
// fallback) as model "llama" (tokens, scores that rank the merges, token types, add_space_prefix); the bos, eos,
// eot/eom (further end-of-generation ids), padding and unknown ids; add_bos_token / add_eos_token as the
// post-processor behaves; the chat template. The token list is padded to vocab_size with unused "[PADi]" tokens,
// as the converter does. Throws ConfigError for a tokenizer llama.cpp would run differently (an unknown
// pre-tokenizer or normalizer, a post-processor that adds other tokens, more tokens than embedding rows).
GgufMetadata gguf_tokenizer_metadata(const Tokenizer& tokenizer, int64_t vocab_size);

}  // namespace lmtune
