// GGUF -> Hugging Face model directory (`miles convert`).
//
// Why: llama.cpp checkpoints (GGUF) carry weights, hyper-parameters and the tokenizer in one file,
// under llama.cpp's names and conventions. miles reads HF directories, so a GGUF is converted once:
// config.json from the `<arch>.*` metadata, float32 weights under HF names (q/k rows un-permuted
// where llama.cpp's converter permuted them), tokenizer.json / tokenizer_config.json from
// `tokenizer.*`. Each part is its own function so tests can check it alone; convert_gguf writes
// them atomically.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "miles/gguf.h"
#include "miles/status.h"
#include "miles/tensor.h"

namespace miles {

// config.json text. Architectures: llama, phi3, qwen2, qwen3, gemma3 (the text model) and glm4moe
// (Glm4MoeForCausalLM, its NextN blocks dropped); others, and features the conversion cannot
// express (MoE outside glm4moe, llama3 rope_freqs, partial rotary outside phi3 / glm4moe, routing
// other than glm4moe's sigmoid), are errors.
Result<std::string> gguf_config_json(const GgufFile& f);

// generation_config.json text (bos / eos / pad ids from the tokenizer metadata).
Result<std::string> gguf_generation_config_json(const GgufFile& f);

// tokenizer.json and tokenizer_config.json texts. Only byte-level BPE (tokenizer.ggml.model "gpt2")
// is supported; the pre-tokenizer follows tokenizer.ggml.pre (gpt-2 / default, smollm, qwen2,
// llama-bpe). Control tokens (token_type 3) become special added tokens, user-defined ones (4)
// plain added tokens, as transformers' own GGUF conversion does.
struct HfTokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
};
Result<HfTokenizerFiles> gguf_tokenizer_files(const GgufFile& f);

// Every tensor, dequantised to float32 and renamed to HF (token_embd -> model.embed_tokens, blk.N.*
// -> model.layers.N.*, output -> lm_head, ...; stacked experts blk.N.ffn_*_exps cut into
// model.layers.N.mlp.experts.<e>.*), checked against the config's shapes; ordered by name. An
// unmapped GGUF tensor is an error, not silently dropped; only glm4moe's NextN blocks are skipped.
Result<std::vector<std::pair<std::string, Tensor>>> gguf_hf_tensors(const GgufFile& f);

struct ConvertOptions {
  bool overwrite = false;  // replace an existing out_dir
};

struct ConvertSummary {
  std::string architecture;  // "LlamaForCausalLM"
  int64_t tensors = 0;
  int64_t parameters = 0;
  // "tokenizer.json", or "tokenizer.gguf": the vocabulary kept as a vocabulary-only GGUF (its
  // tokenizer.* keys) where tokenizer.json cannot express it yet (SentencePiece vocabularies);
  // load_tokenizer finds either in the directory.
  std::string tokenizer_file;
};

// Writes config.json, generation_config.json, model.safetensors (float32), tokenizer.json and
// tokenizer_config.json (or tokenizer.gguf, ConvertSummary::tokenizer_file) into out_dir.
// Everything is written into a temporary sibling directory that is renamed to out_dir at the end,
// so a failed conversion leaves no partial out_dir.
Result<ConvertSummary> convert_gguf(const std::string& gguf_path, const std::string& out_dir,
                                    const ConvertOptions& options = {});

}  // namespace miles
