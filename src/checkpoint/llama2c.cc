// llama2.c checkpoints (the "ak42" version-1 export and run.c's legacy format) as an HF Llama
// model.
//
// Why: stories260K is the project's real trained model, published in llama2.c's formats. Exposing
// it under HF names and conventions lets one model implementation serve both. Two conversions
// matter: llama2.c rotates adjacent pairs (2i, 2i+1) while HF rotates (i, i + head_dim/2), so
// q_proj and k_proj rows are permuted within each head (owned copies); everything else is a view of
// the file. Every size is checked against the file before a byte is read or a buffer allocated.
#include <cstring>

#include "checkpoint/llama2c_parse.h"
#include "checkpoint/mapped_file.h"

namespace miles {
namespace {

constexpr uint32_t kMagic = 0x616b3432;  // "ak42"
constexpr size_t kV1HeaderBytes = 256;
constexpr int64_t kMaxElements = 10'000'000'000;  // per tensor; anything larger is a lying header

struct Dims {
  int64_t dim, hidden, layers, heads, kv_heads, vocab, seq_len;
  bool shared_classifier;
  int64_t head_size() const { return dim / heads; }
  int64_t kv_dim() const { return kv_heads * head_size(); }
};

// Float arrays in file order; each points into the (4-byte aligned) image.
struct Raw {
  const float *rms_att, *rms_ffn, *rms_final, *tok_emb, *wq, *wk, *wv, *wo, *w1, *w2, *w3, *wcls;
};

int32_t read_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);  // llama2.c files are little-endian, as is every host we build for
  return v;
}

Result<Dims> parse_header(const uint8_t* data, size_t size, const std::string& source,
                          size_t* header_bytes) {
  const bool v1 = size >= 8 && static_cast<uint32_t>(read_i32(data)) == kMagic;
  *header_bytes = v1 ? kV1HeaderBytes : 7 * 4;
  if (size < *header_bytes)
    return Status::Error(source + ": file is " + std::to_string(size) +
                         " bytes, shorter than the " + std::to_string(*header_bytes) +
                         "-byte llama2.c header");
  if (v1 && read_i32(data + 4) != 1)
    return Status::Error(source + ": llama2.c export version " +
                         std::to_string(read_i32(data + 4)) +
                         " is not supported (only version 1, float32)");
  const uint8_t* p = data + (v1 ? 8 : 0);
  int64_t f[7];
  for (int i = 0; i < 7; ++i) f[i] = read_i32(p + 4 * i);
  Dims d{f[0], f[1], f[2], f[3], f[4], f[5], f[6], true};
  if (v1) {
    const uint8_t shared = data[36];
    if (shared > 1)
      return Status::Error(source + ": shared_classifier byte is " + std::to_string(shared) +
                           ", expected 0 or 1");
    d.shared_classifier = shared == 1;
  } else {  // legacy: a negative vocab_size announces a separate classifier
    d.shared_classifier = d.vocab > 0;
    d.vocab = d.vocab < 0 ? -d.vocab : d.vocab;
  }
  const std::pair<const char*, int64_t> fields[] = {
      {"dim", d.dim},        {"hidden_dim", d.hidden},   {"n_layers", d.layers},
      {"n_heads", d.heads},  {"n_kv_heads", d.kv_heads}, {"vocab_size", d.vocab},
      {"seq_len", d.seq_len}};
  for (const auto& [name, v] : fields)
    if (v <= 0)
      return Status::Error(source + ": header field " + name + " is " + std::to_string(v) +
                           ", must be positive");
  if (d.dim % d.heads != 0 || d.heads % d.kv_heads != 0 || d.head_size() % 2 != 0)
    return Status::Error(
        source + ": header has dim " + std::to_string(d.dim) + ", n_heads " +
        std::to_string(d.heads) + ", n_kv_heads " + std::to_string(d.kv_heads) +
        "; n_heads must divide dim with an even head size, and n_kv_heads n_heads");
  return d;
}

// Hands out consecutive float arrays, checking each against the end of the image.
struct Cursor {
  const uint8_t* data;
  size_t size;
  size_t offset;
  const std::string& source;

  Result<const float*> take(const char* name, std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape)
      if (__builtin_mul_overflow(n, d, &n) || n > kMaxElements)
        return Status::Error(source + ": tensor '" + name + "' would have over " +
                             std::to_string(kMaxElements) + " elements; the header is wrong");
    const uint64_t bytes = static_cast<uint64_t>(n) * 4;
    if (bytes > size - offset)
      return Status::Error(source + ": tensor '" + name + "' (" + std::to_string(n) +
                           " floats at byte " + std::to_string(offset) +
                           ") runs past the end of the " + std::to_string(size) + "-byte file");
    const float* p = reinterpret_cast<const float*>(data + offset);
    offset += bytes;
    return p;
  }
};

Result<Raw> locate(const Dims& d, bool v1, Cursor& c) {
  const int64_t L = d.layers, D = d.dim, H = d.hidden, KV = d.kv_dim(), V = d.vocab;
  Raw r{};
  auto take = [&](const float** out, const char* name, std::initializer_list<int64_t> shape) {
    auto p = c.take(name, shape);
    if (p.ok()) *out = *p;
    return p.status();
  };
  if (v1) {
    MILES_RETURN_IF_ERROR(take(&r.rms_att, "rms_att_weight", {L, D}));
    MILES_RETURN_IF_ERROR(take(&r.rms_ffn, "rms_ffn_weight", {L, D}));
    MILES_RETURN_IF_ERROR(take(&r.rms_final, "rms_final_weight", {D}));
    MILES_RETURN_IF_ERROR(take(&r.tok_emb, "token_embedding_table", {V, D}));
  } else {
    MILES_RETURN_IF_ERROR(take(&r.tok_emb, "token_embedding_table", {V, D}));
    MILES_RETURN_IF_ERROR(take(&r.rms_att, "rms_att_weight", {L, D}));
  }
  MILES_RETURN_IF_ERROR(take(&r.wq, "wq", {L, D, D}));
  MILES_RETURN_IF_ERROR(take(&r.wk, "wk", {L, KV, D}));
  MILES_RETURN_IF_ERROR(take(&r.wv, "wv", {L, KV, D}));
  MILES_RETURN_IF_ERROR(take(&r.wo, "wo", {L, D, D}));
  if (!v1) MILES_RETURN_IF_ERROR(take(&r.rms_ffn, "rms_ffn_weight", {L, D}));
  MILES_RETURN_IF_ERROR(take(&r.w1, "w1", {L, H, D}));
  MILES_RETURN_IF_ERROR(take(&r.w2, "w2", {L, D, H}));
  MILES_RETURN_IF_ERROR(take(&r.w3, "w3", {L, H, D}));
  if (!v1) {
    const float* unused;
    MILES_RETURN_IF_ERROR(take(&r.rms_final, "rms_final_weight", {D}));
    MILES_RETURN_IF_ERROR(take(&unused, "freq_cis_real", {d.seq_len, d.head_size() / 2}));
    MILES_RETURN_IF_ERROR(take(&unused, "freq_cis_imag", {d.seq_len, d.head_size() / 2}));
  }
  r.wcls = r.tok_emb;
  if (!d.shared_classifier) MILES_RETURN_IF_ERROR(take(&r.wcls, "wcls", {V, D}));
  if (c.offset != c.size)
    return Status::Error(c.source + ": " + std::to_string(c.size - c.offset) +
                         " bytes follow the last tensor; the header does not describe this file");
  return r;
}

// [rows = n_heads * hd, cols] with rotary pairs (2i, 2i+1) -> pairs (i, i + hd/2), per head.
Tensor permute_rotary_rows(const float* w, int64_t n_heads, int64_t hd, int64_t cols) {
  Tensor t = Tensor::zeros(DType::kF32, {n_heads * hd, cols});
  float* out = t.mutable_data<float>();
  const size_t row_bytes = static_cast<size_t>(cols) * sizeof(float);
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < hd / 2; ++i) {
      std::memcpy(out + (h * hd + i) * cols, w + (h * hd + 2 * i) * cols, row_bytes);
      std::memcpy(out + (h * hd + hd / 2 + i) * cols, w + (h * hd + 2 * i + 1) * cols, row_bytes);
    }
  return t;
}

ModelConfig make_config(const Dims& d) {
  ModelConfig c;
  c.arch = Arch::kLlama;
  c.arch_name = "LlamaForCausalLM";
  c.vocab_size = d.vocab;
  c.hidden_size = d.dim;
  c.intermediate_size = d.hidden;
  c.num_layers = d.layers;
  c.num_heads = d.heads;
  c.num_kv_heads = d.kv_heads;
  c.head_dim = d.head_size();
  c.max_position_embeddings = d.seq_len;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = d.shared_classifier;
  c.rope.theta = 10000.0;
  c.rope.max_position_embeddings = d.seq_len;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

TensorMap make_weights(const Dims& d, const Raw& r, const std::string& source,
                       const std::shared_ptr<const void>& owner) {
  const int64_t D = d.dim, H = d.hidden, KV = d.kv_dim(), hd = d.head_size();
  TensorMap m;
  auto view = [&](const std::string& name, std::vector<int64_t> shape, const float* p) {
    m.insert(name, Tensor::view(DType::kF32, std::move(shape), p, owner), source);
  };
  view("model.embed_tokens.weight", {d.vocab, D}, r.tok_emb);
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    view(p + "input_layernorm.weight", {D}, r.rms_att + l * D);
    m.insert(p + "self_attn.q_proj.weight", permute_rotary_rows(r.wq + l * D * D, d.heads, hd, D),
             source);
    m.insert(p + "self_attn.k_proj.weight",
             permute_rotary_rows(r.wk + l * KV * D, d.kv_heads, hd, D), source);
    view(p + "self_attn.v_proj.weight", {KV, D}, r.wv + l * KV * D);
    view(p + "self_attn.o_proj.weight", {D, D}, r.wo + l * D * D);
    view(p + "post_attention_layernorm.weight", {D}, r.rms_ffn + l * D);
    view(p + "mlp.gate_proj.weight", {H, D}, r.w1 + l * H * D);
    view(p + "mlp.up_proj.weight", {H, D}, r.w3 + l * H * D);
    view(p + "mlp.down_proj.weight", {D, H}, r.w2 + l * D * H);
  }
  view("model.norm.weight", {D}, r.rms_final);
  if (!d.shared_classifier) view("lm_head.weight", {d.vocab, D}, r.wcls);
  return m;
}

}  // namespace

Result<Llama2cModel> parse_llama2c(const uint8_t* data, size_t size, const std::string& source,
                                   std::shared_ptr<const void> owner) {
  if (reinterpret_cast<uintptr_t>(data) % alignof(float) != 0) {  // views need aligned floats
    auto copy = std::shared_ptr<float[]>(new float[size / 4 + 1]);
    std::memcpy(copy.get(), data, size);
    return parse_llama2c(reinterpret_cast<const uint8_t*>(copy.get()), size, source,
                         std::shared_ptr<const void>(copy, copy.get()));
  }
  size_t header_bytes = 0;
  MILES_ASSIGN_OR_RETURN(Dims d, parse_header(data, size, source, &header_bytes));
  Cursor cursor{data, size, header_bytes, source};
  MILES_ASSIGN_OR_RETURN(Raw raw, locate(d, header_bytes == kV1HeaderBytes, cursor));
  Llama2cModel model;
  model.config = make_config(d);
  MILES_RETURN_IF_ERROR(model.config.validate(source));
  model.weights = make_weights(d, raw, source, owner);
  return model;
}

Result<Llama2cModel> read_llama2c(const std::string& path) {
  MILES_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  return parse_llama2c(file->data(), file->size(), path, file);
}

}  // namespace miles
