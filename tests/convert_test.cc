// GGUF -> HF conversion: config.json fields, tensor names and the q/k un-permutation (checked
// against transformers' own GGUF loader through tests/data/gguf/tiny_llama*, tiny_qwen2*,
// tiny_phi3* and tiny_gemma3*, made by scripts/make_gguf_fixtures.py; tiny_glm4moe and
// tiny_deepseek2 against the checkpoints they were written from and their transformers goldens),
// logits of the converted model against transformers', the atomic directory write, tokenizer.json
// from real llama.cpp vocabularies (../shared), and the errors.
#include "miles/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "gguf_builder.h"
#include "miles/checkpoint.h"
#include "miles/model.h"
#include "miles/thread_pool.h"
#include "miles/tokenizer.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"

namespace miles {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::GgufBuilder;

std::string fixture(const std::string& name) { return test::data_dir() + "/gguf/" + name; }

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A fresh, empty scratch directory for one test.
fs::path scratch(const std::string& name) {
  const fs::path d = fs::path(test::binary_dir()) / "convert_test_tmp" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TensorMap to_map(std::vector<std::pair<std::string, Tensor>> tensors) {
  TensorMap m;
  for (auto& [name, t] : tensors) m.insert(name, std::move(t), "converted");
  return m;
}

float max_abs_diff(const std::vector<float>& a, const float* b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

std::vector<float> logits_of(const Model& m, const std::vector<int32_t>& ids) {
  ThreadPool pool(2);
  auto kv = m.make_kv_cache();
  SeqSpan s{0, 0, static_cast<int64_t>(ids.size())};
  auto out = m.forward(ids, {&s, 1}, *kv, ForwardOptions{}, &pool);
  EXPECT_TRUE(out.ok()) << out.message();
  return out.ok() ? out->logits : std::vector<float>{};
}

struct TinyExpected {
  std::vector<int32_t> ids;
  TensorMap map;
};

TinyExpected tiny_expected(const std::string& file = "tiny_llama_expected.safetensors") {
  auto m = read_safetensors(fixture(file));
  EXPECT_TRUE(m.ok()) << m.message();
  TinyExpected e;
  if (!m.ok()) return e;
  const Tensor* ids = m->find("ids");
  e.ids.assign(ids->data<int32_t>(), ids->data<int32_t>() + ids->numel());
  e.map = std::move(*m);
  return e;
}

// ---- the tiny Llama written like llama.cpp's converter -----------------------------------------

TEST(Convert, TinyLlamaConfig) {
  auto f = GgufFile::open(fixture("tiny_llama.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  auto text = gguf_config_json(*f);
  ASSERT_TRUE(text.ok()) << text.message();
  const json j = json::parse(*text);
  EXPECT_EQ(j["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(j["rms_norm_eps"].dump(), "1e-05");  // the f32 1e-5, spelled shortest
  EXPECT_EQ(j["rope_theta"], 10000.0);
  EXPECT_TRUE(j["rope_scaling"].is_null());
  auto c = parse_model_config(*text, "config.json");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->arch, Arch::kLlama);
  EXPECT_EQ(c->vocab_size, 288);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 96);
  EXPECT_EQ(c->num_layers, 2);
  EXPECT_EQ(c->num_heads, 4);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->max_position_embeddings, 256);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{2}));
  auto g = gguf_generation_config_json(*f);
  ASSERT_TRUE(g.ok()) << g.message();
  EXPECT_EQ(json::parse(*g)["eos_token_id"], 2);
}

// transformers un-permutes q/k itself; our rows must be exactly its rows.
TEST(Convert, TinyLlamaTensorsMatchTransformers) {
  auto f = GgufFile::open(fixture("tiny_llama.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  auto tensors = gguf_hf_tensors(*f);
  ASSERT_TRUE(tensors.ok()) << tensors.message();
  EXPECT_EQ(tensors->size(), 3u + 2u * 9u);
  const TensorMap m = to_map(std::move(*tensors));
  const TinyExpected e = tiny_expected();
  for (const auto& [ours, theirs] :
       {std::pair<std::string, std::string>{"model.layers.0.self_attn.q_proj.weight", "q_proj0"},
        {"model.layers.0.self_attn.k_proj.weight", "k_proj0"}}) {
    const Tensor* a = m.find(ours);
    const Tensor* b = e.map.find(theirs);
    ASSERT_NE(a, nullptr) << ours;
    ASSERT_NE(b, nullptr) << theirs;
    ASSERT_EQ(a->shape(), b->shape());
    EXPECT_EQ(std::memcmp(a->raw(), b->raw(), static_cast<size_t>(a->nbytes())), 0) << ours;
  }
  EXPECT_TRUE(m.contains("lm_head.weight"));
  EXPECT_TRUE(m.contains("model.layers.1.post_attention_layernorm.weight"));
}

TEST(Convert, TinyLlamaLogitsMatchTransformers) {
  auto f = GgufFile::open(fixture("tiny_llama.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  auto cfg = parse_model_config(*gguf_config_json(*f), "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  auto model = Model::from_weights(*cfg, to_map(*gguf_hf_tensors(*f)));
  ASSERT_TRUE(model.ok()) << model.message();
  const TinyExpected e = tiny_expected();
  const std::vector<float> got = logits_of(**model, e.ids);
  const Tensor* want = e.map.find("logits");
  ASSERT_EQ(static_cast<int64_t>(got.size()), want->numel());
  EXPECT_LE(max_abs_diff(got, want->data<float>()), 1e-4f);
}

TEST(Convert, WritesAnHfDirectoryThatLoads) {
  const fs::path dir = scratch("writes");
  const fs::path out = dir / "tiny";
  auto s = convert_gguf(fixture("tiny_llama.gguf"), out.string());
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(s->architecture, "LlamaForCausalLM");
  EXPECT_EQ(s->tensors, 21);
  for (const char* name : {"config.json", "generation_config.json", "model.safetensors",
                           "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(out / name)) << name;
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1)
      << "temporary directories left behind";
  auto model = Model::load(out.string());
  ASSERT_TRUE(model.ok()) << model.message();
  const TinyExpected e = tiny_expected();
  EXPECT_LE(max_abs_diff(logits_of(**model, e.ids), e.map.find("logits")->data<float>()), 1e-4f);
  auto meta = read_safetensors_metadata((out / "model.safetensors").string());
  ASSERT_TRUE(meta.ok()) << meta.message();
  EXPECT_EQ(meta->at("format"), "pt");

  const json tok = json::parse(read_text(out / "tokenizer.json"));
  EXPECT_EQ(tok["model"]["type"], "BPE");
  EXPECT_EQ(tok["model"]["vocab"].size(), 288u);
  EXPECT_EQ(tok["model"]["vocab"]["\xc4\xa0"
                                  "the"],
            263);  // "Ġthe"
  EXPECT_EQ(tok["model"]["merges"].size(), 29u);
  EXPECT_EQ(tok["model"]["merges"][0], json::array({"t", "h"}));
  ASSERT_EQ(tok["added_tokens"].size(), 3u);
  EXPECT_EQ(tok["added_tokens"][1]["content"], "<|im_start|>");
  EXPECT_EQ(tok["added_tokens"][1]["special"], true);
  EXPECT_EQ(tok["pre_tokenizer"]["pretokenizers"][0]["type"], "Digits");
  EXPECT_EQ(tok["pre_tokenizer"]["pretokenizers"][1]["type"], "ByteLevel");
  EXPECT_TRUE(tok["post_processor"].is_null());  // add_bos_token is false
  EXPECT_EQ(tok["decoder"]["type"], "ByteLevel");
  const json tc = json::parse(read_text(out / "tokenizer_config.json"));
  EXPECT_EQ(tc["bos_token"], "<|im_start|>");
  EXPECT_EQ(tc["eos_token"], "<|im_end|>");
  EXPECT_EQ(tc["add_bos_token"], false);
  EXPECT_NE(tc["chat_template"].get<std::string>().find("<|im_start|>assistant"),
            std::string::npos);
}

TEST(Convert, ExistingDirectoryNeedsOverwrite) {
  const fs::path dir = scratch("existing");
  const fs::path out = dir / "m";
  fs::create_directories(out);
  std::ofstream(out / "keep.txt") << "x";
  auto s = convert_gguf(fixture("tiny_llama.gguf"), out.string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("already exists (pass --force"), std::string::npos) << s.message();
  EXPECT_TRUE(fs::exists(out / "keep.txt"));
  s = convert_gguf(fixture("tiny_llama.gguf"), out.string() + "/",
                   ConvertOptions{.overwrite = true});
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(fs::exists(out / "keep.txt"));
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

TEST(Convert, FailedConversionLeavesNothing) {
  const fs::path dir = scratch("failed");
  // A valid GGUF of an unsupported architecture, and a truncated copy of the tiny Llama.
  const auto gpt2 = GgufBuilder().kv_str("general.architecture", "gpt2").build();
  std::ofstream(dir / "gpt2.gguf", std::ios::binary)
      .write(reinterpret_cast<const char*>(gpt2.data()), static_cast<std::streamsize>(gpt2.size()));
  const std::string whole = read_text(fixture("tiny_llama.gguf"));
  std::ofstream(dir / "cut.gguf", std::ios::binary) << whole.substr(0, whole.size() - 100);
  auto s = convert_gguf((dir / "gpt2.gguf").string(), (dir / "out").string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(
                "'general.architecture' is 'gpt2', which miles convert does not "
                "support (supported: llama, phi3, qwen2, qwen3, gemma3, glm4moe, deepseek2)"),
            std::string::npos)
      << s.message();
  s = convert_gguf((dir / "cut.gguf").string(), (dir / "out").string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cut.gguf: tensor 'output.weight'"), std::string::npos) << s.message();
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2)
      << "only the two inputs may remain";
}

// ---- synthetic models from the builder ----------------------------------------------------------

// ---- the tiny Qwen2 written like llama.cpp's converter ------------------------------------------

bool same_bytes(const Tensor* a, const Tensor* b) {
  return a && b && a->shape() == b->shape() &&
         std::memcmp(a->raw(), b->raw(), static_cast<size_t>(a->nbytes())) == 0;
}

// Qwen2 (q/k/v biases, rows in HF's order, tied embeddings) converted and run: its tensors are
// transformers' own GGUF loader's, its logits within 1e-4, its tokenizer the qwen2 pre-tokenizer.
TEST(Convert, TinyQwen2MatchesTransformers) {
  auto f = GgufFile::open(fixture("tiny_qwen2.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  auto text = gguf_config_json(*f);
  ASSERT_TRUE(text.ok()) << text.message();
  const json j = json::parse(*text);
  EXPECT_EQ(j["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_FALSE(j.contains("attention_bias")) << "Qwen2's biases belong to its class";
  EXPECT_EQ(j["rope_theta"], 1000000.0);
  auto cfg = parse_model_config(*text, "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  EXPECT_EQ(cfg->arch, Arch::kQwen2);
  EXPECT_TRUE(cfg->attention_bias);
  EXPECT_TRUE(cfg->tie_word_embeddings);
  auto tensors = gguf_hf_tensors(*f);
  ASSERT_TRUE(tensors.ok()) << tensors.message();
  EXPECT_EQ(tensors->size(), 2u + 2u * 12u);
  const TensorMap m = to_map(std::move(*tensors));
  const TinyExpected e = tiny_expected("tiny_qwen2_expected.safetensors");
  EXPECT_TRUE(same_bytes(m.find("model.layers.0.self_attn.q_proj.weight"), e.map.find("q_proj0")));
  EXPECT_TRUE(same_bytes(m.find("model.layers.1.self_attn.q_proj.bias"), e.map.find("q_bias1")));
  EXPECT_TRUE(same_bytes(m.find("model.layers.0.self_attn.v_proj.bias"), e.map.find("v_bias0")));

  const fs::path out = scratch("qwen2") / "tiny";
  auto s = convert_gguf(fixture("tiny_qwen2.gguf"), out.string());
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(s->architecture, "Qwen2ForCausalLM");
  auto model = Model::load(out.string());
  ASSERT_TRUE(model.ok()) << model.message();
  EXPECT_LE(max_abs_diff(logits_of(**model, e.ids), e.map.find("logits")->data<float>()), 1e-4f);
  const json tok = json::parse(read_text(out / "tokenizer.json"));
  EXPECT_EQ(tok["pre_tokenizer"]["pretokenizers"][0]["type"], "Split");
}

// Phi-3 as llama.cpp writes it (attn_qkv and ffn_up fused): converted under HF's fused names, the
// tensors byte-equal to transformers' own GGUF loader's, the model's logits within 1e-4.
TEST(Convert, TinyPhi3MatchesTransformers) {
  auto f = GgufFile::open(fixture("tiny_phi3.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  auto text = gguf_config_json(*f);
  ASSERT_TRUE(text.ok()) << text.message();
  const json j = json::parse(*text);
  EXPECT_EQ(j["architectures"][0], "Phi3ForCausalLM");
  EXPECT_TRUE(j["sliding_window"].is_null());
  EXPECT_FALSE(j.contains("partial_rotary_factor"));
  auto tensors = gguf_hf_tensors(*f);
  ASSERT_TRUE(tensors.ok()) << tensors.message();
  const TensorMap m = to_map(std::move(*tensors));
  const TinyExpected e = tiny_expected("tiny_phi3_expected.safetensors");
  EXPECT_TRUE(
      same_bytes(m.find("model.layers.1.self_attn.qkv_proj.weight"), e.map.find("qkv_proj1")));
  EXPECT_TRUE(
      same_bytes(m.find("model.layers.0.mlp.gate_up_proj.weight"), e.map.find("gate_up_proj0")));
  const fs::path out = scratch("phi3") / "tiny";
  auto s = convert_gguf(fixture("tiny_phi3.gguf"), out.string());
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(s->architecture, "Phi3ForCausalLM");
  auto model = Model::load(out.string());
  ASSERT_TRUE(model.ok()) << model.message();
  EXPECT_LE(max_abs_diff(logits_of(**model, e.ids), e.map.find("logits")->data<float>()), 1e-4f);
}

// Gemma 3 as llama.cpp writes it (norms stored as 1 + w, head_dim 8 unlike hidden / heads, 7
// layers, window 4, linear RoPE scaling; Q8_0, Q5_0, F16 and F32 tensors): config.json carries what
// llama.cpp fixes in its code (layer 5 the only full-attention layer, the sliding layers' base
// 10000, query_pre_attn_scalar = head_dim), and every converted tensor is bitwise transformers' own
// GGUF loader's (norms minus 1 in float32).
TEST(Convert, TinyGemma3MatchesTransformers) {
  auto f = GgufFile::open(fixture("tiny_gemma3.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  auto text = gguf_config_json(*f);
  ASSERT_TRUE(text.ok()) << text.message();
  const json j = json::parse(*text);
  EXPECT_EQ(j["architectures"], json::array({"Gemma3ForCausalLM"}));
  EXPECT_EQ(j["model_type"], "gemma3_text");
  EXPECT_EQ(j["vocab_size"], 288);
  EXPECT_EQ(j["hidden_size"], 32);
  EXPECT_EQ(j["intermediate_size"], 64);
  EXPECT_EQ(j["num_hidden_layers"], 7);
  EXPECT_EQ(j["num_attention_heads"], 2);
  EXPECT_EQ(j["num_key_value_heads"], 1);
  EXPECT_EQ(j["head_dim"], 8);
  EXPECT_EQ(j["max_position_embeddings"], 256);
  EXPECT_EQ(j["rms_norm_eps"], 1e-6);
  EXPECT_EQ(j["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_FALSE(j.contains("hidden_act"));
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["query_pre_attn_scalar"], 8);
  EXPECT_EQ(j["sliding_window"], 4);
  const json sliding = "sliding_attention", full = "full_attention";
  EXPECT_EQ(j["layer_types"],
            json::array({sliding, sliding, sliding, sliding, sliding, full, sliding}));
  EXPECT_EQ(j["rope_theta"], 1000000.0);
  EXPECT_EQ(j["rope_local_base_freq"], 10000.0);
  EXPECT_EQ(j["rope_scaling"], json::parse(R"({"rope_type": "linear", "factor": 2.0})"));
  EXPECT_TRUE(j.contains("final_logit_softcapping") && j["final_logit_softcapping"].is_null());
  EXPECT_TRUE(j.contains("attn_logit_softcapping") && j["attn_logit_softcapping"].is_null());
  EXPECT_EQ(j["bos_token_id"], 1);
  EXPECT_EQ(j["eos_token_id"], 2);

  auto tensors = gguf_hf_tensors(*f);
  ASSERT_TRUE(tensors.ok()) << tensors.message();
  const TensorMap m = to_map(std::move(*tensors));
  const TinyExpected e = tiny_expected("tiny_gemma3_expected.safetensors");
  ASSERT_EQ(m.size() + 2, e.map.size()) << "every tensor but ids and logits";
  for (const std::string& name : m.names()) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(same_bytes(m.find(name), e.map.find(name)));
  }
  // The norms arrive as HF's w (~ 0.2 N(0, 1)), not as the stored 1 + w.
  const Tensor* norm = m.find("model.layers.5.post_feedforward_layernorm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_LT(std::fabs(norm->data<float>()[0]), 0.9f);

  const fs::path out = scratch("gemma3") / "tiny";
  auto s = convert_gguf(fixture("tiny_gemma3.gguf"), out.string());
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(s->architecture, "Gemma3ForCausalLM");
  EXPECT_EQ(s->tensors, static_cast<int64_t>(m.size()));
  EXPECT_EQ(read_text(out / "config.json"), *text);
}

// The converted directory runs as llama.cpp runs the GGUF: logits within 1e-4 of
// Gemma3ForCausalLM with the fixture's weights under that config (needs miles' Gemma 3 model).
TEST(Convert, TinyGemma3LogitsMatchTheReference) {
  const fs::path out = scratch("gemma3_logits") / "tiny";
  auto s = convert_gguf(fixture("tiny_gemma3.gguf"), out.string());
  ASSERT_TRUE(s.ok()) << s.message();
  auto cfg = parse_model_config(read_text(out / "config.json"), "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  EXPECT_EQ(cfg->max_position_embeddings, 256);
  auto model = Model::load(out.string());
  ASSERT_TRUE(model.ok()) << model.message();
  const TinyExpected e = tiny_expected("tiny_gemma3_expected.safetensors");
  EXPECT_LE(max_abs_diff(logits_of(**model, e.ids), e.map.find("logits")->data<float>()), 1e-4f);
}

// ---- the tiny GLM-4 MoE written like llama.cpp's converter
// ---------------------------------------

// The config.json a tiny fixture converts to (`j`, and parsed in `cfg`) and that of the checkpoint
// tests/data/models/`model` it was written from (`want`).
void fixture_configs(const GgufFile& f, const std::string& model, json* j, ModelConfig* cfg,
                     ModelConfig* want) {
  auto text = gguf_config_json(f);
  ASSERT_TRUE(text.ok()) << text.message();
  *j = json::parse(*text);
  auto ours = parse_model_config(*text, "config.json");
  ASSERT_TRUE(ours.ok()) << ours.message();
  auto theirs = load_model_config(test::data_dir() + "/models/" + model + "/config.json");
  ASSERT_TRUE(theirs.ok()) << theirs.message();
  *cfg = std::move(*ours);
  *want = std::move(*theirs);
}

// What a converted MoE model's config shares with its checkpoint's: sizes, sigmoid routing, norms,
// RoPE base and tying.
void expect_moe_config_matches(const ModelConfig& cfg, const ModelConfig& want) {
  for (const auto& [ours, theirs] :
       {std::pair{cfg.vocab_size, want.vocab_size},
        {cfg.hidden_size, want.hidden_size},
        {cfg.intermediate_size, want.intermediate_size},
        {cfg.num_layers, want.num_layers},
        {cfg.num_heads, want.num_heads},
        {cfg.num_kv_heads, want.num_kv_heads},
        {cfg.head_dim, want.head_dim},
        {cfg.max_position_embeddings, want.max_position_embeddings},
        {cfg.moe.num_experts, want.moe.num_experts},
        {cfg.moe.top_k, want.moe.top_k},
        {cfg.moe.moe_intermediate_size, want.moe.moe_intermediate_size},
        {cfg.moe.n_group, want.moe.n_group},
        {cfg.moe.topk_group, want.moe.topk_group},
        {cfg.moe.n_shared_experts, want.moe.n_shared_experts},
        {cfg.moe.first_k_dense_replace, want.moe.first_k_dense_replace}})
    EXPECT_EQ(ours, theirs);
  EXPECT_EQ(cfg.moe.score, RouterScore::kSigmoid);
  EXPECT_EQ(cfg.moe.norm_topk_prob, want.moe.norm_topk_prob);
  EXPECT_EQ(cfg.moe.routed_scaling_factor, want.moe.routed_scaling_factor);
  EXPECT_EQ(cfg.rms_norm_eps, want.rms_norm_eps);
  EXPECT_EQ(cfg.rope.theta, want.rope.theta);
  EXPECT_EQ(cfg.tie_word_embeddings, want.tie_word_embeddings);
}

// Every tensor `f` converts to is bitwise that of tests/data/models/`model`, and there are as many;
// the converted tensors in `m`.
void expect_checkpoint_tensors(const GgufFile& f, const std::string& model, TensorMap* m) {
  auto tensors = gguf_hf_tensors(f);
  ASSERT_TRUE(tensors.ok()) << tensors.message();
  *m = to_map(std::move(*tensors));
  auto hf = read_safetensors(test::data_dir() + "/models/" + model + "/model.safetensors");
  ASSERT_TRUE(hf.ok()) << hf.message();
  EXPECT_EQ(m->size(), hf->size());
  for (const std::string& name : hf->names()) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(same_bytes(m->find(name), hf->find(name)));
  }
}

// tests/data/gguf/tiny_`name`.gguf converts (to `out`) as `architecture` with its vocabulary in
// `tokenizer_file`, loads, and gives transformers' logits (goldens/`model`.safetensors) on 3 or
// more sequences.
void expect_converted_logits(const std::string& name, const std::string& model,
                             const std::string& architecture, const std::string& tokenizer_file,
                             fs::path* out) {
  *out = scratch(name) / "tiny";
  auto s = convert_gguf(fixture("tiny_" + name + ".gguf"), out->string());
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(s->architecture, architecture);
  EXPECT_EQ(s->tokenizer_file, tokenizer_file);
  auto loaded = Model::load(out->string());
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  auto goldens = read_safetensors(test::data_dir() + "/goldens/" + model + ".safetensors");
  ASSERT_TRUE(goldens.ok()) << goldens.message();
  float worst = 0;
  int seqs = 0;
  for (;; ++seqs) {
    const std::string p = "seq" + std::to_string(seqs) + ".";
    const Tensor* ids = goldens->find(p + "ids");
    if (!ids) break;
    const std::vector<int32_t> v(ids->data<int32_t>(), ids->data<int32_t>() + ids->numel());
    const std::vector<float> got = logits_of(**loaded, v);
    const std::vector<float> want = goldens->find(p + "logits")->to_f32();
    ASSERT_EQ(got.size(), want.size());
    worst = std::max(worst, max_abs_diff(got, want.data()));
  }
  EXPECT_GE(seqs, 3);
  EXPECT_LE(worst, 1e-4f);
  std::printf("tiny_%s: %d sequences, max |logit - transformers| = %.3g\n", name.c_str(), seqs,
              worst);
}

// GLM-4 MoE as llama.cpp's Glm4MoeModel converter writes tests/data/models/glm4_moe (float32,
// experts stacked into ffn_*_exps, one NextN block after the 3 layers): config.json is
// Glm4MoeForCausalLM's with the checkpoint's routing (2 groups, top 1 group, scale 2.5, normalised,
// a shared expert, layer 0 dense, q/k/v biases, q/k norms, partial rotary 0.5) and no NextN layer,
// and every converted tensor is bitwise the checkpoint's, none of the NextN block's.
TEST(Convert, TinyGlm4MoeMatchesTheCheckpoint) {
  auto f = GgufFile::open(fixture("tiny_glm4moe.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  json j;
  ModelConfig cfg, want;
  ASSERT_NO_FATAL_FAILURE(fixture_configs(*f, "glm4_moe", &j, &cfg, &want));
  EXPECT_EQ(j["architectures"], json::array({"Glm4MoeForCausalLM"}));
  EXPECT_EQ(j["model_type"], "glm4_moe");
  EXPECT_EQ(j["num_hidden_layers"], 3);
  EXPECT_EQ(j["num_nextn_predict_layers"], 0);
  EXPECT_EQ(j["head_dim"], 16);
  EXPECT_EQ(j["partial_rotary_factor"], 0.5);
  EXPECT_EQ(j["rms_norm_eps"], 1e-6);
  EXPECT_EQ(j["attention_bias"], true);
  EXPECT_EQ(j["use_qk_norm"], true);
  EXPECT_EQ(j["n_routed_experts"], 8);
  EXPECT_EQ(j["num_experts_per_tok"], 2);
  EXPECT_EQ(j["moe_intermediate_size"], 32);
  EXPECT_EQ(j["n_shared_experts"], 1);
  EXPECT_EQ(j["first_k_dense_replace"], 1);
  EXPECT_EQ(j["norm_topk_prob"], true);
  EXPECT_EQ(j["routed_scaling_factor"], 2.5);
  EXPECT_EQ(j["n_group"], 2);
  EXPECT_EQ(j["topk_group"], 1);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(cfg.arch, Arch::kGlm4Moe);
  expect_moe_config_matches(cfg, want);
  EXPECT_EQ(cfg.rotary_dim(), want.rotary_dim());
  EXPECT_EQ(cfg.use_qk_norm, want.use_qk_norm);
  EXPECT_EQ(cfg.attention_bias, want.attention_bias);

  TensorMap m;
  ASSERT_NO_FATAL_FAILURE(expect_checkpoint_tensors(*f, "glm4_moe", &m));
  for (const std::string& name : m.names())
    EXPECT_EQ(name.find("model.layers.3."), std::string::npos) << "a NextN tensor: " << name;
}

// The converted directory loads and computes transformers' logits (its goldens for the
// checkpoint), and its tokenizer.json is the glm4 vocabulary as miles reads the GGUF (the Llama-3
// split, a whole word that is a token taken as it is).
TEST(Convert, TinyGlm4MoeLogitsMatchTransformers) {
  fs::path out;
  ASSERT_NO_FATAL_FAILURE(
      expect_converted_logits("glm4moe", "glm4_moe", "Glm4MoeForCausalLM", "tokenizer.json", &out));

  const json tok = json::parse(read_text(out / "tokenizer.json"));
  EXPECT_EQ(tok["pre_tokenizer"]["pretokenizers"][0]["type"], "Split");
  EXPECT_EQ(tok["model"]["ignore_merges"], true);
  EXPECT_TRUE(tok["post_processor"].is_null());
  EXPECT_EQ(tok["model"]["vocab"].size(), 1024u);
  const json tc = json::parse(read_text(out / "tokenizer_config.json"));
  EXPECT_EQ(tc["add_bos_token"], false);
  EXPECT_EQ(tc["eos_token"], "<|im_end|>");
  // tokenizer.json encodes as miles' reading of the GGUF vocabulary (llama.cpp's glm4 rules) does.
  auto f = GgufFile::open(fixture("tiny_glm4moe.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  auto direct = gguf_tokenizer(*f);
  auto written = load_tokenizer(out.string(), 1024);
  ASSERT_TRUE(direct.ok() && written.ok()) << direct.message() << written.message();
  for (const char* text : {"What is the capital of France?", "Paris is 12345 of\n\n  the",
                           "<|im_start|>user\nWhat's 3,141?<|im_end|>"})
    for (bool special : {false, true})
      EXPECT_EQ((*written)->encode(text, special), (*direct)->encode(text, special)) << text;
}

// ---- the tiny DeepSeek-V3 written like llama.cpp's converter (deepseek2)
// -------------------------

// DeepSeek-V3 as llama.cpp's DeepseekV2Model converter writes tests/data/models/deepseek_v3
// (float32, MLA as MQA over the latent, kv_b_proj split into attn_k_b / attn_v_b, experts
// stacked): config.json is DeepseekV3ForCausalLM's with the checkpoint's MLA sizes, interleaved
// RoPE and routing, and every converted tensor is bitwise the checkpoint's (kv_b_proj put back
// together from its two halves).
TEST(Convert, TinyDeepseek2MatchesTheCheckpoint) {
  auto f = GgufFile::open(fixture("tiny_deepseek2.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  json j;
  ModelConfig cfg, want;
  ASSERT_NO_FATAL_FAILURE(fixture_configs(*f, "deepseek_v3", &j, &cfg, &want));
  EXPECT_EQ(j["architectures"], json::array({"DeepseekV3ForCausalLM"}));
  EXPECT_EQ(j["model_type"], "deepseek_v3");
  EXPECT_EQ(j["num_hidden_layers"], 3);
  EXPECT_EQ(j["num_key_value_heads"], 4);
  EXPECT_EQ(j["q_lora_rank"], 24);
  EXPECT_EQ(j["kv_lora_rank"], 32);
  EXPECT_EQ(j["qk_nope_head_dim"], 16);
  EXPECT_EQ(j["qk_rope_head_dim"], 8);
  EXPECT_EQ(j["v_head_dim"], 12);
  EXPECT_EQ(j["head_dim"], 8);
  EXPECT_EQ(j["rope_interleave"], true);
  EXPECT_TRUE(j["rope_scaling"].is_null());
  EXPECT_EQ(j["n_routed_experts"], 8);
  EXPECT_EQ(j["routed_scaling_factor"], 2.5);
  EXPECT_EQ(j["norm_topk_prob"], true);
  EXPECT_EQ(j["num_nextn_predict_layers"], 0);
  EXPECT_EQ(cfg.arch, Arch::kDeepseekV3);
  expect_moe_config_matches(cfg, want);
  for (int64_t MlaConfig::*size :
       {&MlaConfig::q_lora_rank, &MlaConfig::kv_lora_rank, &MlaConfig::qk_nope_head_dim,
        &MlaConfig::qk_rope_head_dim, &MlaConfig::v_head_dim, &MlaConfig::num_key_value_heads})
    EXPECT_EQ(cfg.mla.*size, want.mla.*size);
  EXPECT_EQ(cfg.mla.rope_interleave, want.mla.rope_interleave);
  EXPECT_EQ(cfg.attention_scale(), want.attention_scale());

  TensorMap m;
  ASSERT_NO_FATAL_FAILURE(expect_checkpoint_tensors(*f, "deepseek_v3", &m));
}

// The converted directory loads and computes transformers' logits (its goldens for the
// checkpoint); the deepseek-v3 vocabulary is kept as tokenizer.gguf.
TEST(Convert, TinyDeepseek2LogitsMatchTransformers) {
  fs::path out;
  expect_converted_logits("deepseek2", "deepseek_v3", "DeepseekV3ForCausalLM", "tokenizer.gguf",
                          &out);
}

// A one-layer model with hidden 8, 2 heads of 4, 1 KV head, intermediate 8, vocab 5; tensor values
// encode their row index (row r of a matrix is all r + 1000 * tensor number) so permutations show.
struct TinyMeta {
  uint32_t feed_forward_length = 8;  // what the metadata says (the tensors are always 8)
  uint32_t head_count_kv = 1;
};

GgufBuilder tiny_model(const std::string& arch, bool with_output, bool qk_norm = false,
                       TinyMeta meta = {}) {
  GgufBuilder b;
  b.kv_str("general.architecture", arch)
      .kv_u32(arch + ".block_count", 1)
      .kv_u32(arch + ".embedding_length", 8)
      .kv_u32(arch + ".feed_forward_length", meta.feed_forward_length)
      .kv_u32(arch + ".attention.head_count", 2)
      .kv_u32(arch + ".attention.head_count_kv", meta.head_count_kv)
      .kv_u32(arch + ".context_length", 64)
      .kv_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-6f);
  int n = 0;
  auto mat = [&](const std::string& name, uint64_t rows, uint64_t cols) {
    std::vector<float> v(rows * cols);
    for (uint64_t r = 0; r < rows; ++r)
      for (uint64_t c = 0; c < cols; ++c) v[r * cols + c] = static_cast<float>(1000 * n + r);
    ++n;
    b.tensor_f32(name, {cols, rows}, v);
  };
  auto vec = [&](const std::string& name, uint64_t len) {
    b.tensor_f32(name, {len}, std::vector<float>(len, 1.0f));
  };
  mat("token_embd.weight", 5, 8);
  vec("blk.0.attn_norm.weight", 8);
  mat("blk.0.attn_q.weight", 8, 8);
  mat("blk.0.attn_k.weight", 4, 8);
  mat("blk.0.attn_v.weight", 4, 8);
  mat("blk.0.attn_output.weight", 8, 8);
  vec("blk.0.ffn_norm.weight", 8);
  mat("blk.0.ffn_gate.weight", 8, 8);
  mat("blk.0.ffn_up.weight", 8, 8);
  mat("blk.0.ffn_down.weight", 8, 8);
  if (qk_norm) {
    vec("blk.0.attn_q_norm.weight", 4);
    vec("blk.0.attn_k_norm.weight", 4);
  }
  vec("output_norm.weight", 8);
  if (with_output) mat("output.weight", 5, 8);
  return b;
}

Result<GgufFile> parse(const std::vector<uint8_t>& bytes) {
  auto owner = std::make_shared<std::vector<uint8_t>>(bytes);
  return GgufFile::parse(owner->data(), owner->size(), "m.gguf", owner);
}

// A broken model built by `b`: its config or its tensors fail to convert, and the error names the
// file and `what` (the key or tensor).
void expect_model_error(GgufBuilder b, const std::string& what) {
  auto f = parse(b.build());
  ASSERT_TRUE(f.ok()) << f.message();
  auto cfg = gguf_config_json(*f);
  auto t = cfg.ok() ? gguf_hf_tensors(*f).status() : cfg.status();
  ASSERT_FALSE(t.ok()) << what;
  EXPECT_NE(t.message().find("m.gguf: "), std::string::npos) << t.message();
  EXPECT_NE(t.message().find(what), std::string::npos) << t.message();
}

// The first element of each row of a converted matrix.
std::vector<float> row_heads(const TensorMap& m, const std::string& name) {
  const Tensor* t = m.find(name);
  EXPECT_NE(t, nullptr) << name;
  std::vector<float> out;
  if (!t) return out;
  for (int64_t r = 0; r < t->dim(0); ++r) out.push_back(t->data<float>()[r * t->dim(1)]);
  return out;
}

TEST(Convert, LlamaQkRowsAreUnpermutedPerHead) {
  auto f = parse(tiny_model("llama", true).build());
  ASSERT_TRUE(f.ok()) << f.message();
  auto t = gguf_hf_tensors(*f);
  ASSERT_TRUE(t.ok()) << t.message();
  const TensorMap m = to_map(std::move(*t));
  // head_dim 4: HF row h*4 + j*2 + i comes from GGUF row h*4 + 2i + j: order 0 2 1 3 per head.
  EXPECT_EQ(row_heads(m, "model.layers.0.self_attn.q_proj.weight"),
            (std::vector<float>{1000, 1002, 1001, 1003, 1004, 1006, 1005, 1007}));
  EXPECT_EQ(row_heads(m, "model.layers.0.self_attn.k_proj.weight"),
            (std::vector<float>{2000, 2002, 2001, 2003}));
  EXPECT_EQ(row_heads(m, "model.layers.0.self_attn.v_proj.weight"),
            (std::vector<float>{3000, 3001, 3002, 3003}));
  EXPECT_TRUE(m.contains("lm_head.weight"));
}

TEST(Convert, Qwen3KeepsRowOrderAndMapsQkNorms) {
  auto b = tiny_model("qwen3", false, true);
  b.kv_u32("qwen3.attention.key_length", 4).kv_u32("qwen3.attention.value_length", 4);
  auto f = parse(b.build());
  ASSERT_TRUE(f.ok()) << f.message();
  auto cfg_text = gguf_config_json(*f);
  ASSERT_TRUE(cfg_text.ok()) << cfg_text.message();
  auto cfg = parse_model_config(*cfg_text, "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  EXPECT_EQ(cfg->arch, Arch::kQwen3);
  EXPECT_TRUE(cfg->tie_word_embeddings);
  auto t = gguf_hf_tensors(*f);
  ASSERT_TRUE(t.ok()) << t.message();
  const TensorMap m = to_map(std::move(*t));
  EXPECT_EQ(row_heads(m, "model.layers.0.self_attn.q_proj.weight"),
            (std::vector<float>{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007}));
  EXPECT_TRUE(m.contains("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_FALSE(m.contains("lm_head.weight"));
  auto model = Model::from_weights(*cfg, m);
  EXPECT_TRUE(model.ok()) << model.message();
}

TEST(Convert, Qwen2MapsQkvBiasesAndNeedsThem) {
  auto b = tiny_model("qwen2", false);
  b.tensor_f32("blk.0.attn_q.bias", {8}, std::vector<float>(8, 0.5f))
      .tensor_f32("blk.0.attn_k.bias", {4}, std::vector<float>(4, 0.25f));
  auto partial = parse(b.build());
  ASSERT_TRUE(partial.ok()) << partial.message();
  auto missing = gguf_hf_tensors(*partial);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("'blk.0.attn_v.bias' is missing"), std::string::npos)
      << missing.message();
  b.tensor_f32("blk.0.attn_v.bias", {4}, std::vector<float>(4, 0.125f));
  auto f = parse(b.build());
  ASSERT_TRUE(f.ok()) << f.message();
  auto cfg = parse_model_config(*gguf_config_json(*f), "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  EXPECT_EQ(cfg->arch, Arch::kQwen2);
  auto t = gguf_hf_tensors(*f);
  ASSERT_TRUE(t.ok()) << t.message();
  const TensorMap m = to_map(std::move(*t));
  EXPECT_EQ(row_heads(m, "model.layers.0.self_attn.q_proj.weight"),
            (std::vector<float>{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007}));
  const Tensor* vb = m.find("model.layers.0.self_attn.v_proj.bias");
  ASSERT_NE(vb, nullptr);
  EXPECT_EQ(vb->data<float>()[3], 0.125f);
  EXPECT_TRUE(Model::from_weights(*cfg, m).ok());
}

// Phi-3's metadata that transformers' GGUF loader drops and llama.cpp uses: a partial
// rope.dimension_count (Phi-4-mini) and attention.sliding_window go into config.json; longrope's
// factor tensors and unfused projections are refused, naming them.
TEST(Convert, Phi3PartialRotaryWindowAndRefusals) {
  auto phi3 = [](bool longrope, bool unfused) {
    GgufBuilder b;
    b.kv_str("general.architecture", "phi3")
        .kv_u32("phi3.block_count", 1)
        .kv_u32("phi3.embedding_length", 8)
        .kv_u32("phi3.feed_forward_length", 8)
        .kv_u32("phi3.attention.head_count", 2)
        .kv_u32("phi3.attention.head_count_kv", 1)
        .kv_u32("phi3.context_length", 64)
        .kv_u32("phi3.rope.dimension_count", 2)
        .kv_u32("phi3.attention.sliding_window", 3)
        .kv_f32("phi3.attention.layer_norm_rms_epsilon", 1e-6f);
    auto mat = [&](const std::string& name, uint64_t rows, uint64_t cols) {
      b.tensor_f32(name, {cols, rows}, std::vector<float>(rows * cols, 0.01f));
    };
    auto vec = [&](const std::string& name, uint64_t n) {
      b.tensor_f32(name, {n}, std::vector<float>(n, 1.0f));
    };
    mat("token_embd.weight", 5, 8);
    vec("blk.0.attn_norm.weight", 8);
    mat(unfused ? "blk.0.attn_q.weight" : "blk.0.attn_qkv.weight", unfused ? 8 : 16, 8);
    mat("blk.0.attn_output.weight", 8, 8);
    vec("blk.0.ffn_norm.weight", 8);
    mat("blk.0.ffn_up.weight", 16, 8);
    mat("blk.0.ffn_down.weight", 8, 8);
    vec("output_norm.weight", 8);
    if (longrope) vec("rope_factors_long.weight", 1);
    return b;
  };
  auto f = parse(phi3(false, false).build());
  ASSERT_TRUE(f.ok()) << f.message();
  auto text = gguf_config_json(*f);
  ASSERT_TRUE(text.ok()) << text.message();
  auto cfg = parse_model_config(*text, "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.message() << "\n" << *text;
  EXPECT_EQ(cfg->arch, Arch::kPhi3);
  EXPECT_EQ(cfg->rotary_dim(), 2);  // head_dim 4 × 0.5
  EXPECT_EQ(cfg->sliding_window, 3);
  auto t = gguf_hf_tensors(*f);
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_TRUE(to_map(std::move(*t)).contains("model.layers.0.self_attn.qkv_proj.weight"));
  auto lr = parse(phi3(true, false).build());
  ASSERT_TRUE(lr.ok()) << lr.message();
  auto refused = gguf_config_json(*lr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("rope_factors_long.weight"), std::string::npos)
      << refused.message();
  auto un = parse(phi3(false, true).build());
  ASSERT_TRUE(un.ok()) << un.message();
  auto unfused = gguf_hf_tensors(*un);
  ASSERT_FALSE(unfused.ok());
  EXPECT_NE(unfused.message().find("blk.0.attn_q.weight"), std::string::npos) << unfused.message();
}

// A hand-built gemma3 file: `layers` layers of hidden 8, 2 heads of head_dim 2 (key_length; hidden
// / heads would be 4), 1 KV head, intermediate 8, vocab 5, window 3 (or none); matrix rows hold
// their index, norms 1 + 0.5 (HF's 0.5).
GgufBuilder gemma3_model(int layers, bool window = true) {
  GgufBuilder b;
  b.kv_str("general.architecture", "gemma3")
      .kv_u32("gemma3.block_count", static_cast<uint32_t>(layers))
      .kv_u32("gemma3.embedding_length", 8)
      .kv_u32("gemma3.feed_forward_length", 8)
      .kv_u32("gemma3.attention.head_count", 2)
      .kv_u32("gemma3.attention.head_count_kv", 1)
      .kv_u32("gemma3.attention.key_length", 2)
      .kv_u32("gemma3.attention.value_length", 2)
      .kv_u32("gemma3.context_length", 64)
      .kv_f32("gemma3.rope.freq_base", 1e6f)
      .kv_f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f);
  if (window) b.kv_u32("gemma3.attention.sliding_window", 3);
  auto mat = [&](const std::string& name, uint64_t rows, uint64_t cols) {
    std::vector<float> v(rows * cols);
    for (uint64_t r = 0; r < rows; ++r)
      for (uint64_t c = 0; c < cols; ++c) v[r * cols + c] = static_cast<float>(r);
    b.tensor_f32(name, {cols, rows}, v);
  };
  auto norm = [&](const std::string& name, uint64_t n) {
    b.tensor_f32(name, {n}, std::vector<float>(n, 1.5f));
  };
  mat("token_embd.weight", 5, 8);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight", 8);
    mat(p + "attn_q.weight", 4, 8);
    mat(p + "attn_k.weight", 2, 8);
    mat(p + "attn_v.weight", 2, 8);
    norm(p + "attn_q_norm.weight", 2);
    norm(p + "attn_k_norm.weight", 2);
    mat(p + "attn_output.weight", 8, 4);
    norm(p + "post_attention_norm.weight", 8);
    norm(p + "ffn_norm.weight", 8);
    mat(p + "ffn_gate.weight", 8, 8);
    mat(p + "ffn_up.weight", 8, 8);
    mat(p + "ffn_down.weight", 8, 8);
    norm(p + "post_ffw_norm.weight", 8);
  }
  norm("output_norm.weight", 8);
  return b;
}

TEST(Convert, Gemma3NamesNormsPatternAndScale) {
  auto f = parse(gemma3_model(13).build());
  ASSERT_TRUE(f.ok()) << f.message();
  auto text = gguf_config_json(*f);
  ASSERT_TRUE(text.ok()) << text.message();
  const json j = json::parse(*text);
  std::vector<std::string> types;
  for (const json& t : j["layer_types"]) types.push_back(t);
  std::vector<std::string> want(13, "sliding_attention");
  want[5] = want[11] = "full_attention";  // llama.cpp: layer il slides iff il % 6 < 5
  EXPECT_EQ(types, want);
  EXPECT_EQ(j["query_pre_attn_scalar"], 2);  // head_dim, not hidden / heads
  EXPECT_EQ(j["sliding_window"], 3);
  EXPECT_TRUE(j["rope_scaling"].is_null());
  EXPECT_EQ(j["rope_local_base_freq"], 10000.0);
  auto t = gguf_hf_tensors(*f);
  ASSERT_TRUE(t.ok()) << t.message();
  const TensorMap m = to_map(std::move(*t));
  EXPECT_EQ(m.size(), 2u + 13u * 13u);
  // q/k rows keep HF's order; every norm is the stored value minus 1.
  EXPECT_EQ(row_heads(m, "model.layers.0.self_attn.q_proj.weight"),
            (std::vector<float>{0, 1, 2, 3}));
  for (const char* name :
       {"model.layers.12.input_layernorm.weight", "model.layers.12.post_attention_layernorm.weight",
        "model.layers.12.pre_feedforward_layernorm.weight",
        "model.layers.12.post_feedforward_layernorm.weight",
        "model.layers.12.self_attn.q_norm.weight", "model.layers.12.self_attn.k_norm.weight",
        "model.norm.weight"}) {
    const Tensor* n = m.find(name);
    ASSERT_NE(n, nullptr) << name;
    EXPECT_EQ(n->data<float>()[0], 0.5f) << name;
  }
  EXPECT_EQ(m.find("model.embed_tokens.weight")->data<float>()[8], 1.0f);  // not a norm: as stored
  EXPECT_FALSE(m.contains("lm_head.weight"));

  // A pattern key that agrees with llama.cpp's fixed pattern is accepted (scalar or per layer).
  std::vector<int32_t> flags(13, 1);
  flags[5] = flags[11] = 0;
  for (auto b : {gemma3_model(13).kv_u32("gemma3.attention.sliding_window_pattern", 6),
                 gemma3_model(13).kv_i32s("gemma3.attention.sliding_window_pattern", flags),
                 gemma3_model(13).kv_f32("gemma3.rope.freq_base_swa", 10000.f),
                 gemma3_model(13).kv_f32("gemma3.final_logit_softcapping", 0.f)}) {
    auto ok = parse(b.build());
    ASSERT_TRUE(ok.ok()) << ok.message();
    EXPECT_TRUE(gguf_config_json(*ok).ok()) << gguf_config_json(*ok).message();
  }
  // Linear RoPE scaling (the full layers').
  auto scaled = parse(gemma3_model(1)
                          .kv_str("gemma3.rope.scaling.type", "linear")
                          .kv_f32("gemma3.rope.scaling.factor", 8.f)
                          .build());
  ASSERT_TRUE(scaled.ok()) << scaled.message();
  const json sj = json::parse(*gguf_config_json(*scaled));
  EXPECT_EQ(sj["rope_scaling"], json::parse(R"({"rope_type": "linear", "factor": 8.0})"));
  EXPECT_EQ(sj["layer_types"], json::array({"sliding_attention"}));
}

// llama.cpp's 27B rule (62 layers): the queries are scaled by 1 / sqrt(hidden / heads), not by
// 1 / sqrt(head_dim). Only the metadata and token_embd are needed for config.json.
TEST(Convert, Gemma3TwentySevenBScalesByHiddenOverHeads) {
  GgufBuilder b;
  b.kv_str("general.architecture", "gemma3")
      .kv_u32("gemma3.block_count", 62)
      .kv_u32("gemma3.embedding_length", 5376)
      .kv_u32("gemma3.feed_forward_length", 21504)
      .kv_u32("gemma3.attention.head_count", 32)
      .kv_u32("gemma3.attention.head_count_kv", 16)
      .kv_u32("gemma3.attention.key_length", 128)
      .kv_u32("gemma3.attention.value_length", 128)
      .kv_u32("gemma3.attention.sliding_window", 1024)
      .kv_u32("gemma3.context_length", 131072)
      .kv_f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f)
      .tensor("token_embd.weight", {5376, 2}, 0, std::vector<uint8_t>(5376 * 2 * 4));
  auto f = parse(b.build());
  ASSERT_TRUE(f.ok()) << f.message();
  auto text = gguf_config_json(*f);
  ASSERT_TRUE(text.ok()) << text.message();
  const json j = json::parse(*text);
  EXPECT_EQ(j["query_pre_attn_scalar"], 168);
  EXPECT_EQ(j["head_dim"], 128);
  EXPECT_EQ(j["layer_types"].size(), 62u);
  EXPECT_EQ(j["layer_types"][59], "full_attention");
  EXPECT_EQ(j["layer_types"][61], "sliding_attention");
}

// What Gemma3ForCausalLM (or llama.cpp) cannot be told is refused, naming the key or tensor.
TEST(Convert, Gemma3Refusals) {
  expect_model_error(gemma3_model(1).kv_f32("gemma3.final_logit_softcapping", 30.f),
                     "'gemma3.final_logit_softcapping' is 30");
  expect_model_error(gemma3_model(1).kv_f32("gemma3.attn_logit_softcapping", 50.f),
                     "'gemma3.attn_logit_softcapping' is 50");
  expect_model_error(gemma3_model(7).kv_u32("gemma3.attention.sliding_window_pattern", 4),
                     "'gemma3.attention.sliding_window_pattern' differs from llama.cpp's");
  expect_model_error(gemma3_model(2).kv_i32s("gemma3.attention.sliding_window_pattern", {1, 0}),
                     "'gemma3.attention.sliding_window_pattern' differs from llama.cpp's");
  expect_model_error(gemma3_model(1).kv_f32("gemma3.rope.freq_base_swa", 20000.f),
                     "'gemma3.rope.freq_base_swa' is 20000");
  expect_model_error(gemma3_model(1)
                         .kv_str("gemma3.rope.scaling.type", "yarn")
                         .kv_f32("gemma3.rope.scaling.factor", 4.f)
                         .kv_u32("gemma3.rope.scaling.original_context_length", 32),
                     "'gemma3.rope.scaling.type' is 'yarn'");
  expect_model_error(gemma3_model(1).kv_u32("gemma3.embedding_length_per_layer_input", 4),
                     "'gemma3.embedding_length_per_layer_input' is not a key miles convert knows");
  expect_model_error(gemma3_model(1).kv_u32("gemma3.vision.block_count", 27),
                     "'gemma3.vision.block_count' describes a vision tower");
  expect_model_error(gemma3_model(1).kv_u32("gemma3.vocab_size", 6), "'gemma3.vocab_size' is 6");
  expect_model_error(gemma3_model(1, false), "'gemma3.attention.sliding_window' is missing or 0");
  expect_model_error(gemma3_model(1, false).kv_u32("gemma3.attention.sliding_window", 0),
                     "'gemma3.attention.sliding_window' is missing or 0");
  expect_model_error(gemma3_model(1).tensor_f32("v.blk.0.attn_q.weight", {2}, {1, 1}),
                     "tensor 'v.blk.0.attn_q.weight' belongs to a vision tower");
  expect_model_error(gemma3_model(1).tensor_f32("mm.input_projection.weight", {2}, {1, 1}),
                     "tensor 'mm.input_projection.weight' belongs to a vision tower");
  // A Llama-shaped layer (no post-attention / post-FFN norms) is missing Gemma's norms.
  expect_model_error(tiny_model("gemma3", true, true).kv_u32("gemma3.attention.sliding_window", 3),
                     "tensor 'blk.0.post_attention_norm.weight' is missing");
}

TEST(Convert, TiedEmbeddingsWhenThereIsNoOutput) {
  auto f = parse(tiny_model("llama", false).build());
  ASSERT_TRUE(f.ok()) << f.message();
  auto cfg = parse_model_config(*gguf_config_json(*f), "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  EXPECT_TRUE(cfg->tie_word_embeddings);
  const TensorMap m = to_map(*gguf_hf_tensors(*f));
  EXPECT_FALSE(m.contains("lm_head.weight"));
  EXPECT_TRUE(Model::from_weights(*cfg, m).ok());
}

// Each broken model: the error names the file and the key or tensor.
TEST(Convert, Errors) {
  expect_model_error(tiny_model("llama", true).kv_u32("llama.expert_count", 8),
                     "mixture-of-experts");
  expect_model_error(tiny_model("llama", true).kv_u32("llama.rope.dimension_count", 2),
                     "partial rotary");
  expect_model_error(tiny_model("llama", true).tensor_f32("rope_freqs.weight", {2}, {1, 1}),
                     "'rope_freqs.weight'");
  expect_model_error(tiny_model("llama", true).kv_str("llama.rope.scaling.type", "longrope"),
                     "'llama.rope.scaling.type' is 'longrope'");
  expect_model_error(tiny_model("llama", true).tensor_f32("blk.0.attn_rot.weight", {2}, {1, 1}),
                     "tensor 'blk.0.attn_rot.weight' has no Hugging Face counterpart");
  expect_model_error(tiny_model("llama", true)
                         .tensor_f32("blk.1.attn_norm.weight", {8}, std::vector<float>(8, 1.f)),
                     "tensor 'blk.1.attn_norm.weight' has a layer number outside [0, 1)");
  expect_model_error(
      tiny_model("llama", true).tensor_f32("blk.0.attn_q_norm.weight", {4}, {1, 1, 1, 1}),
      "'blk.0.attn_q_norm.weight' has no Hugging Face counterpart in LlamaForCausalLM");
  expect_model_error(tiny_model("llama", true, false, {.head_count_kv = 3}),
                     "must divide attention.head_count");
  // A missing tensor, and a wrong shape.
  expect_model_error(tiny_model("qwen3", true), "tensor 'blk.0.attn_q_norm.weight' is missing");
  expect_model_error(
      tiny_model("llama", true, false, {.feed_forward_length = 16}),
      "tensor 'blk.0.ffn_gate.weight' has shape [8, 8] but LlamaForCausalLM needs [16, 8]");
}

// A hand-built glm4moe file: 2 layers (0 dense, 1 MoE) of hidden 8, 2 heads of 4 (rotary 2), 1 KV
// head, 4 experts of 2 (2 used), a shared expert, and `nextn` NextN blocks; matrices hold
// 1000 * (tensor number) + row (rows counted across stacked experts).
struct GlmOpts {
  bool fused_gate_up = false;  // ffn_gate_up_exps instead of ffn_gate_exps + ffn_up_exps
  bool scale = true;           // expert_weights_scale present
  bool probs_b = true;         // blk.1.exp_probs_b.bias present
  uint32_t gating = 2;         // expert_gating_func
  uint32_t groups = 0;         // expert_group_count (0: absent)
  uint32_t groups_used = 0;    // expert_group_used_count (0: absent)
  uint32_t nextn = 1;          // NextN blocks (tensors) after the 2 layers
  int64_t nextn_key = -1;      // nextn_predict_layers (-1: = nextn)
  uint32_t rope_dims = 2;      // rope.dimension_count
};

// Adds tensors to a builder: matrices of row-major `shape` whose every element of row r (counted
// over all leading dims) is 1000 * (tensor number) + r, and vectors of ones.
struct RowTensors {
  GgufBuilder& b;
  int n = 0;

  void mat(const std::string& name, std::vector<uint64_t> shape) {
    const uint64_t cols = shape.back();
    uint64_t rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
    std::vector<float> v(rows * cols);
    for (uint64_t r = 0; r < rows; ++r)
      for (uint64_t c = 0; c < cols; ++c) v[r * cols + c] = static_cast<float>(1000 * n + r);
    ++n;
    b.tensor_f32(name, std::vector<uint64_t>(shape.rbegin(), shape.rend()), v);
  }
  void vec(const std::string& name, uint64_t len) {
    b.tensor_f32(name, {len}, std::vector<float>(len, 1.0f));
  }
};

// The routing keys glm4moe and deepseek2 share (prefix `p`): 4 experts of 2, 2 used, a shared
// expert, layer 0 dense.
void moe_keys(GgufBuilder& b, const std::string& p) {
  b.kv_u32(p + "expert_count", 4)
      .kv_u32(p + "expert_used_count", 2)
      .kv_u32(p + "expert_feed_forward_length", 2)
      .kv_u32(p + "expert_shared_count", 1)
      .kv_u32(p + "leading_dense_block_count", 1);
}

// The feed-forward tensors of layer `l` (prefix `x`, hidden 8) in glm4moe and deepseek2: layer 0's
// dense MLP of 8; later layers' router, exp_probs_b (if `probs_b`), 4 stacked experts of 2 (gate
// and up fused if `fused`) and a shared expert; from layer 2 on, a NextN block.
void moe_ffn_tensors(RowTensors& t, const std::string& x, uint32_t l, bool probs_b = true,
                     bool fused = false) {
  const uint64_t h = 8;
  if (l == 0) {
    t.mat(x + "ffn_gate.weight", {8, h});
    t.mat(x + "ffn_up.weight", {8, h});
    t.mat(x + "ffn_down.weight", {h, 8});
    return;
  }
  t.mat(x + "ffn_gate_inp.weight", {4, h});
  if (probs_b) t.vec(x + "exp_probs_b.bias", 4);
  if (fused) {
    t.mat(x + "ffn_gate_up_exps.weight", {4, 4, h});
  } else {
    t.mat(x + "ffn_gate_exps.weight", {4, 2, h});
    t.mat(x + "ffn_up_exps.weight", {4, 2, h});
  }
  t.mat(x + "ffn_down_exps.weight", {4, h, 2});
  t.mat(x + "ffn_gate_shexp.weight", {2, h});
  t.mat(x + "ffn_up_shexp.weight", {2, h});
  t.mat(x + "ffn_down_shexp.weight", {h, 2});
  if (l >= 2) {
    t.mat(x + "nextn.eh_proj.weight", {h, 2 * h});
    t.vec(x + "nextn.enorm.weight", h);
    t.vec(x + "nextn.hnorm.weight", h);
  }
}

GgufBuilder glm4moe_model(GlmOpts o = {}) {
  GgufBuilder b;
  const std::string p = "glm4moe.";
  b.kv_str("general.architecture", "glm4moe")
      .kv_u32(p + "block_count", 2 + o.nextn)
      .kv_u32(p + "context_length", 64)
      .kv_u32(p + "embedding_length", 8)
      .kv_u32(p + "feed_forward_length", 8)
      .kv_u32(p + "attention.head_count", 2)
      .kv_u32(p + "attention.head_count_kv", 1)
      .kv_u32(p + "attention.key_length", 4)
      .kv_u32(p + "attention.value_length", 4)
      .kv_u32(p + "rope.dimension_count", o.rope_dims)
      .kv_f32(p + "attention.layer_norm_rms_epsilon", 1e-5f);
  moe_keys(b, p);
  b.kv_u32(p + "expert_gating_func", o.gating).kv_bool(p + "expert_weights_norm", true);
  if (o.scale) b.kv_f32(p + "expert_weights_scale", 1.5f);
  if (o.groups) b.kv_u32(p + "expert_group_count", o.groups);
  if (o.groups_used) b.kv_u32(p + "expert_group_used_count", o.groups_used);
  const int64_t nextn_key = o.nextn_key >= 0 ? o.nextn_key : o.nextn;
  if (nextn_key > 0) b.kv_u32(p + "nextn_predict_layers", static_cast<uint32_t>(nextn_key));
  RowTensors t{b};
  t.mat("token_embd.weight", {5, 8});
  for (uint32_t l = 0; l < 2 + o.nextn; ++l) {
    const std::string x = "blk." + std::to_string(l) + ".";
    t.vec(x + "attn_norm.weight", 8);
    t.mat(x + "attn_q.weight", {8, 8});
    t.mat(x + "attn_k.weight", {4, 8});
    t.mat(x + "attn_v.weight", {4, 8});
    t.mat(x + "attn_output.weight", {8, 8});
    t.vec(x + "post_attention_norm.weight", 8);
    moe_ffn_tensors(t, x, l, o.probs_b || l != 1, o.fused_gate_up);
  }
  t.vec("output_norm.weight", 8);
  t.mat("output.weight", {5, 8});
  return b;
}

// Stacked experts are cut into HF's per-expert matrices (gate rows before up rows in the fused
// ffn_gate_up_exps), the NextN block is skipped, and the result loads.
TEST(Convert, Glm4MoeSplitsStackedExpertsAndSkipsNextN) {
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "ffn_gate_up_exps" : "ffn_gate_exps + ffn_up_exps");
    auto f = parse(glm4moe_model({.fused_gate_up = fused}).build());
    ASSERT_TRUE(f.ok()) << f.message();
    auto text = gguf_config_json(*f);
    ASSERT_TRUE(text.ok()) << text.message();
    const json j = json::parse(*text);
    EXPECT_EQ(j["num_hidden_layers"], 2);
    EXPECT_EQ(j["attention_bias"], false);
    EXPECT_EQ(j["use_qk_norm"], false);
    EXPECT_EQ(j["n_group"], 1);
    EXPECT_EQ(j["topk_group"], 1);
    EXPECT_EQ(j["routed_scaling_factor"], 1.5);
    EXPECT_EQ(j["partial_rotary_factor"], 0.5);
    auto cfg = parse_model_config(*text, "config.json");
    ASSERT_TRUE(cfg.ok()) << cfg.message();
    auto t = gguf_hf_tensors(*f);
    ASSERT_TRUE(t.ok()) << t.message();
    const TensorMap m = to_map(std::move(*t));
    // embed, norm, lm_head; layer 0: 2 norms, 4 attention, 3 MLP; layer 1: 2 norms, 4 attention,
    // router + bias, 4 experts * 3, 3 shared.
    EXPECT_EQ(m.size(), 3u + 9u + 23u);
    for (const std::string& name : m.names())
      EXPECT_EQ(name.find("model.layers.2."), std::string::npos) << name;
    const std::string x = "model.layers.1.mlp.experts.";
    const float g0 = row_heads(m, x + "0.gate_proj.weight")[0];
    const float u0 = row_heads(m, x + "0.up_proj.weight")[0];
    const float d0 = row_heads(m, x + "0.down_proj.weight")[0];
    for (int e = 0; e < 4; ++e) {
      const std::string ex = x + std::to_string(e) + ".";
      const float stride = fused ? 4.f : 2.f;  // rows per expert in the gate (or gate_up) tensor
      EXPECT_EQ(row_heads(m, ex + "gate_proj.weight"),
                (std::vector<float>{g0 + stride * e, g0 + stride * e + 1}));
      EXPECT_EQ(row_heads(m, ex + "up_proj.weight"),
                (std::vector<float>{u0 + stride * e, u0 + stride * e + 1}));
      std::vector<float> down(8);
      for (int r = 0; r < 8; ++r) down[r] = d0 + 8.f * e + r;
      EXPECT_EQ(row_heads(m, ex + "down_proj.weight"), down);
    }
    if (fused) {
      EXPECT_EQ(u0, g0 + 2) << "up rows follow gate rows";
    }
    EXPECT_EQ(m.find("model.layers.1.mlp.gate.e_score_correction_bias")->shape(),
              (std::vector<int64_t>{4}));
    EXPECT_EQ(m.find("model.layers.1.mlp.shared_experts.down_proj.weight")->shape(),
              (std::vector<int64_t>{8, 2}));
    EXPECT_TRUE(Model::from_weights(*cfg, m).ok());
  }
  // Without NextN blocks, and with group routing.
  auto f = parse(glm4moe_model({.groups = 2, .groups_used = 1, .nextn = 0}).build());
  ASSERT_TRUE(f.ok()) << f.message();
  const json j = json::parse(*gguf_config_json(*f));
  EXPECT_EQ(j["n_group"], 2);
  EXPECT_EQ(j["topk_group"], 1);
  EXPECT_TRUE(gguf_hf_tensors(*f).ok());
}

// Every glm4moe field miles cannot honour is an error naming it; MoE stays refused elsewhere.
TEST(Convert, Glm4MoeRefusals) {
  expect_model_error(glm4moe_model({.gating = 1}),
                     "'glm4moe.expert_gating_func' is 1 (softmax); only sigmoid");
  expect_model_error(glm4moe_model({.gating = 3}), "'glm4moe.expert_gating_func' is 3");
  expect_model_error(glm4moe_model({.scale = false}), "'glm4moe.expert_weights_scale' is missing");
  expect_model_error(glm4moe_model({.groups = 2, .groups_used = 2}),
                     "'glm4moe.expert_group_used_count' is 2, must be in [1, 1]");
  expect_model_error(glm4moe_model({.groups = 3, .groups_used = 1}),
                     "'glm4moe.expert_group_count' (3) must divide expert_count (4)");
  expect_model_error(glm4moe_model({.groups = 4, .groups_used = 1}),
                     "'glm4moe.expert_group_count' (4) must divide");
  expect_model_error(glm4moe_model({.nextn_key = 3}),
                     "'glm4moe.nextn_predict_layers' is 3, must be in [0, block_count = 3)");
  expect_model_error(glm4moe_model({.nextn_key = 0}),
                     "tensor 'blk.2.nextn.eh_proj.weight' has no Hugging Face counterpart");
  expect_model_error(glm4moe_model().kv_f32("glm4moe.expert_group_scale", 2.f),
                     "'glm4moe.expert_group_scale' is not a key miles convert knows for glm4moe");
  expect_model_error(glm4moe_model().kv_i32s("glm4moe.rope.dimension_sections", {1, 1, 0, 0}),
                     "'glm4moe.rope.dimension_sections' is set (multimodal M-RoPE");
  expect_model_error(glm4moe_model().kv_u32("glm4moe.expert_shared_feed_forward_length", 4),
                     "'glm4moe.expert_shared_feed_forward_length' is 4");
  expect_model_error(glm4moe_model({.rope_dims = 3}),
                     "'glm4moe.rope.dimension_count' is 3 but head_dim is 4");
  expect_model_error(glm4moe_model({.probs_b = false}),
                     "tensor 'blk.1.exp_probs_b.bias' is missing");
  expect_model_error(
      glm4moe_model().tensor_f32("blk.1.ffn_gate.weight", {8, 8}, std::vector<float>(64, 1.f)),
      "'blk.1.ffn_gate.weight' is a dense MLP's, but layer 1 is a mixture-of-experts layer");
  expect_model_error(
      glm4moe_model().tensor_f32("blk.0.ffn_gate_inp.weight", {8, 4}, std::vector<float>(32, 1.f)),
      "'blk.0.ffn_gate_inp.weight' belongs to a mixture-of-experts layer, but layer 0 is dense");
  expect_model_error(
      glm4moe_model().tensor_f32("blk.1.attn_q.bias", {8}, std::vector<float>(8, 1.f)),
      "'blk.1.attn_q.bias' is present but blk.0.attn_q.bias is not");
  expect_model_error(
      glm4moe_model().tensor_f32("blk.1.attn_k_norm.weight", {4}, std::vector<float>(4, 1.f)),
      "'blk.1.attn_k_norm.weight' is present but blk.0.attn_q_norm.weight is not");
  expect_model_error(
      glm4moe_model({.fused_gate_up = true})
          .tensor_f32("blk.1.ffn_gate_exps.weight", {8, 2, 4}, std::vector<float>(64, 1.f)),
      "both give model.layers.1.mlp.experts.0.gate_proj.weight");
  expect_model_error(
      glm4moe_model().tensor_f32("blk.1.ffn_norm.weight", {8}, std::vector<float>(8, 1.f)),
      "'blk.1.ffn_norm.weight' has no Hugging Face counterpart in Glm4MoeForCausalLM");
  // Other architectures' MoE files are still refused.
  expect_model_error(tiny_model("qwen3", true, true).kv_u32("qwen3.expert_count", 8),
                     "mixture-of-experts GGUF models are not supported by miles convert for qwen3");
}

// A hand-built deepseek2 file: 2 layers (0 dense, 1 MoE) of hidden 8, 2 heads, q LoRA rank 4 (or
// a plain attn_q), kv LoRA rank 4, qk_nope 2, qk_rope 2, v 3, 4 experts of 2 (2 used), a shared
// expert, `nextn` NextN blocks. kv_b_proj's element (row, c) is 100 * row + c, written as
// attn_k_b / attn_v_b (split) or attn_kv_b; other matrices hold 1000 * (tensor number) + row.
struct DsOpts {
  bool split = true;           // key_length_mla / value_length_mla, attn_k_b + attn_v_b
  bool q_lora = true;          // attn_q_a / attn_q_a_norm / attn_q_b, else attn_q
  int64_t gating = 2;          // expert_gating_func (-1: absent)
  bool scale = true;           // expert_weights_scale present
  std::string rope_type = "";  // rope.scaling.type ("": absent)
  float log_mul = 0.1f;        // yarn_log_multiplier (with yarn)
  float attn_factor = 1.f;     // yarn_attn_factor (with yarn; 1: absent)
  uint32_t kv_heads = 0;       // head_count_kv (0: 1 split, 2 legacy)
  uint32_t nextn = 0;          // NextN blocks after the 2 layers
};

GgufBuilder deepseek2_model(DsOpts o = {}) {
  GgufBuilder b;
  const std::string p = "deepseek2.";
  const uint64_t h = 8, heads = 2, ql = 4, r = 4, nope = 2, rot = 2, v = 3;
  b.kv_str("general.architecture", "deepseek2")
      .kv_u32(p + "block_count", 2 + o.nextn)
      .kv_u32(p + "context_length", 64)
      .kv_u32(p + "embedding_length", h)
      .kv_u32(p + "feed_forward_length", 8)
      .kv_u32(p + "attention.head_count", heads)
      .kv_u32(p + "attention.head_count_kv", o.kv_heads ? o.kv_heads : (o.split ? 1 : heads))
      .kv_u32(p + "attention.key_length", o.split ? r + rot : nope + rot)
      .kv_u32(p + "attention.value_length", o.split ? r : v)
      .kv_u32(p + "attention.kv_lora_rank", r)
      .kv_u32(p + "rope.dimension_count", rot)
      .kv_f32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  moe_keys(b, p);
  b.kv_bool(p + "expert_weights_norm", true);
  if (o.split)
    b.kv_u32(p + "attention.key_length_mla", nope + rot)
        .kv_u32(p + "attention.value_length_mla", v);
  if (o.q_lora) b.kv_u32(p + "attention.q_lora_rank", ql);
  if (o.gating >= 0) b.kv_u32(p + "expert_gating_func", static_cast<uint32_t>(o.gating));
  if (o.scale) b.kv_f32(p + "expert_weights_scale", 2.5f);
  if (o.nextn) b.kv_u32(p + "nextn_predict_layers", o.nextn);
  if (!o.rope_type.empty()) {
    b.kv_str(p + "rope.scaling.type", o.rope_type).kv_f32(p + "rope.scaling.factor", 40.f);
    b.kv_u32(p + "rope.scaling.original_context_length", 16);
    b.kv_f32(p + "rope.scaling.yarn_log_multiplier", o.log_mul);
    if (o.attn_factor != 1.f) b.kv_f32(p + "rope.scaling.yarn_attn_factor", o.attn_factor);
  }
  RowTensors t{b};
  t.mat("token_embd.weight", {5, h});
  for (uint32_t l = 0; l < 2 + o.nextn; ++l) {
    const std::string x = "blk." + std::to_string(l) + ".";
    t.vec(x + "attn_norm.weight", h);
    t.vec(x + "ffn_norm.weight", h);
    if (o.q_lora) {
      t.mat(x + "attn_q_a.weight", {ql, h});
      t.vec(x + "attn_q_a_norm.weight", ql);
      t.mat(x + "attn_q_b.weight", {heads * (nope + rot), ql});
    } else {
      t.mat(x + "attn_q.weight", {heads * (nope + rot), h});
    }
    t.mat(x + "attn_kv_a_mqa.weight", {r + rot, h});
    t.vec(x + "attn_kv_a_norm.weight", r);
    // kv_b_proj [heads * (nope + v), r], element (row, c) = 100 * row + c.
    auto kv_b = [&](uint64_t row, uint64_t c) { return static_cast<float>(100 * row + c); };
    if (o.split) {
      std::vector<float> k(heads * r * nope), vb(heads * v * r);
      for (uint64_t hd = 0; hd < heads; ++hd) {
        for (uint64_t c = 0; c < r; ++c)
          for (uint64_t i = 0; i < nope; ++i)
            k[(hd * r + c) * nope + i] = kv_b(hd * (nope + v) + i, c);
        for (uint64_t j = 0; j < v; ++j)
          for (uint64_t c = 0; c < r; ++c)
            vb[(hd * v + j) * r + c] = kv_b(hd * (nope + v) + nope + j, c);
      }
      b.tensor_f32(x + "attn_k_b.weight", {nope, r, heads}, k);
      b.tensor_f32(x + "attn_v_b.weight", {r, v, heads}, vb);
    } else {
      std::vector<float> kv(heads * (nope + v) * r);
      for (uint64_t row = 0; row < heads * (nope + v); ++row)
        for (uint64_t c = 0; c < r; ++c) kv[row * r + c] = kv_b(row, c);
      b.tensor_f32(x + "attn_kv_b.weight", {r, heads * (nope + v)}, kv);
    }
    t.mat(x + "attn_output.weight", {h, heads * v});
    moe_ffn_tensors(t, x, l);
  }
  t.vec("output_norm.weight", h);
  t.mat("output.weight", {5, h});
  return b;
}

// kv_b_proj comes back whole from attn_k_b (transposed key rows) + attn_v_b or from attn_kv_b;
// a plain attn_q gives q_lora_rank null; NextN blocks are skipped; the result loads.
TEST(Convert, Deepseek2RebuildsKvBAndLoads) {
  for (const DsOpts& o :
       {DsOpts{}, DsOpts{.split = false, .q_lora = false}, DsOpts{.q_lora = false, .nextn = 1}}) {
    SCOPED_TRACE(std::string(o.split ? "attn_k_b + attn_v_b" : "attn_kv_b") +
                 (o.q_lora ? ", q LoRA" : ", attn_q") + (o.nextn ? ", NextN" : ""));
    auto f = parse(deepseek2_model(o).build());
    ASSERT_TRUE(f.ok()) << f.message();
    auto text = gguf_config_json(*f);
    ASSERT_TRUE(text.ok()) << text.message();
    const json j = json::parse(*text);
    EXPECT_EQ(j["num_hidden_layers"], 2);
    EXPECT_EQ(j["num_key_value_heads"], 2);
    EXPECT_EQ(j["qk_nope_head_dim"], 2);
    EXPECT_EQ(j["qk_rope_head_dim"], 2);
    EXPECT_EQ(j["v_head_dim"], 3);
    EXPECT_EQ(j["kv_lora_rank"], 4);
    if (o.q_lora) {
      EXPECT_EQ(j["q_lora_rank"], 4);
    } else {
      EXPECT_TRUE(j["q_lora_rank"].is_null());
    }
    EXPECT_EQ(j["routed_scaling_factor"], 2.5);
    auto cfg = parse_model_config(*text, "config.json");
    ASSERT_TRUE(cfg.ok()) << cfg.message();
    auto t = gguf_hf_tensors(*f);
    ASSERT_TRUE(t.ok()) << t.message();
    const TensorMap m = to_map(std::move(*t));
    // embed, norm, lm_head; per layer 2 norms, q (3 or 1), kv_a + its norm, kv_b, o; layer 0: 3
    // MLP; layer 1: router + bias, 4 experts * 3, 3 shared.
    const size_t attn = 2u + (o.q_lora ? 3u : 1u) + 4u;
    EXPECT_EQ(m.size(), 3u + 2 * attn + 3u + 17u);
    for (int l = 0; l < 2; ++l) {
      const Tensor* kv =
          m.find("model.layers." + std::to_string(l) + ".self_attn.kv_b_proj.weight");
      ASSERT_NE(kv, nullptr);
      ASSERT_EQ(kv->shape(), (std::vector<int64_t>{10, 4}));
      for (int64_t row = 0; row < 10; ++row)
        for (int64_t c = 0; c < 4; ++c)
          EXPECT_EQ(kv->data<float>()[row * 4 + c], static_cast<float>(100 * row + c)) << row;
    }
    for (const std::string& name : m.names())
      EXPECT_EQ(name.find("model.layers.2."), std::string::npos) << name;
    EXPECT_TRUE(Model::from_weights(*cfg, m).ok());
  }
}

// yarn: yarn_log_multiplier / 0.1 is DeepSeek's mscale_all_dim (the attention scale's mscale
// squared), the rotation's magnitude 1.
TEST(Convert, Deepseek2YarnBecomesMscaleAllDim) {
  auto f = parse(deepseek2_model({.rope_type = "yarn", .log_mul = 0.0707f}).build());
  ASSERT_TRUE(f.ok()) << f.message();
  auto text = gguf_config_json(*f);
  ASSERT_TRUE(text.ok()) << text.message();
  const json j = json::parse(*text);
  const json& y = j["rope_scaling"];
  EXPECT_EQ(y["rope_type"], "yarn");
  EXPECT_EQ(y["factor"], 40.0);
  EXPECT_EQ(y["original_max_position_embeddings"], 16);
  // llama.cpp's float division undoes the converter's 0.1 (0.0707f / 0.1f is 0.70699996f,
  // spelled with the fewest digits that read back as that float).
  EXPECT_EQ(y["mscale_all_dim"], 0.70699996);
  EXPECT_EQ(y["mscale"], y["mscale_all_dim"]);
  EXPECT_EQ(y["attention_factor"], 1.0);
  EXPECT_EQ(y["beta_fast"], 32.0);
  EXPECT_EQ(y["beta_slow"], 1.0);
  auto cfg = parse_model_config(*text, "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  // llama.cpp's kq_scale: (1 + 0.1 * mscale_all_dim * ln(factor))^2 / sqrt(qk_nope + qk_rope).
  const float m = 1.0f + 0.1f * 0.707f * std::log(40.0f);
  EXPECT_NEAR(cfg->attention_scale(), m * m / 2.0f, 1e-6f);
}

// Every deepseek2 field miles cannot honour is an error naming it.
TEST(Convert, Deepseek2Refusals) {
  expect_model_error(deepseek2_model({.gating = -1}),
                     "'deepseek2.expert_gating_func' is missing, which llama.cpp's deepseek2 reads "
                     "as softmax");
  expect_model_error(deepseek2_model({.gating = 0}), "'deepseek2.expert_gating_func' is 0");
  expect_model_error(deepseek2_model({.gating = 1}),
                     "'deepseek2.expert_gating_func' is 1 (softmax); only sigmoid");
  expect_model_error(deepseek2_model({.rope_type = "linear"}),
                     "'deepseek2.rope.scaling.type' is 'linear'");
  expect_model_error(deepseek2_model({.rope_type = "yarn", .attn_factor = 2.f}),
                     "'deepseek2.rope.scaling.yarn_attn_factor' is 2");
  expect_model_error(deepseek2_model({.kv_heads = 2}),
                     "'deepseek2.attention.head_count_kv' is 2; llama.cpp's MLA form");
  expect_model_error(deepseek2_model({.split = false, .kv_heads = 1}),
                     "'deepseek2.attention.head_count_kv' is 1; without key_length_mla");
  expect_model_error(deepseek2_model().kv_f32("deepseek2.attention.temperature_scale", 0.1f),
                     "'deepseek2.attention.temperature_scale' is not a key miles convert knows");
  expect_model_error(
      deepseek2_model().tensor_f32("blk.0.attn_kv_b.weight", {4, 10}, std::vector<float>(40, 1.f)),
      "'blk.0.attn_kv_b.weight' is present but attention.key_length_mla is too");
  expect_model_error(
      deepseek2_model({.split = false})
          .tensor_f32("blk.1.attn_k_b.weight", {2, 4, 2}, std::vector<float>(16, 1.f)),
      "'blk.1.attn_k_b.weight' is present but attention.key_length_mla is not");
  expect_model_error(
      deepseek2_model().tensor_f32("blk.0.attn_q.weight", {8, 8}, std::vector<float>(64, 1.f)),
      "'blk.0.attn_q.weight' is present but attention.q_lora_rank is 4");
  expect_model_error(deepseek2_model().tensor_f32("blk.1.nextn.eh_proj.weight", {16, 8},
                                                  std::vector<float>(128, 1.f)),
                     "'blk.1.nextn.eh_proj.weight' has no Hugging Face counterpart in "
                     "DeepseekV3ForCausalLM");
}

// ---- tokenizer.json from real llama.cpp vocabularies
// ---------------------------------------------

TEST(ConvertTokenizer, Qwen2VocabMatchesTheHfQwen3Tokenizer) {
  MILES_REQUIRE_SHARED();
  auto f = GgufFile::open(test::shared_dir() + "/tokenizers/llama.cpp-vocab/ggml-vocab-qwen2.gguf");
  ASSERT_TRUE(f.ok()) << f.message();
  auto files = gguf_tokenizer_files(*f);
  ASSERT_TRUE(files.ok()) << files.message();
  const json ours = json::parse(files->tokenizer_json);
  const json hf = json::parse(read_text(test::shared_dir() + "/tokenizers/qwen3/tokenizer.json"));
  // Every HF vocabulary entry and merge, the same; the GGUF also lists the added tokens and
  // padding.
  int64_t same = 0;
  for (const auto& [token, id] : hf["model"]["vocab"].items()) {
    ASSERT_TRUE(ours["model"]["vocab"].contains(token)) << token;
    ASSERT_EQ(ours["model"]["vocab"][token], id) << token;
    ++same;
  }
  EXPECT_EQ(same, 151643);
  EXPECT_EQ(ours["model"]["merges"], hf["model"]["merges"]);
  EXPECT_EQ(ours["pre_tokenizer"]["pretokenizers"][0]["pattern"],
            hf["pre_tokenizer"]["pretokenizers"][0]["pattern"]);
  bool im_start = false;
  for (const json& t : ours["added_tokens"])
    if (t["content"] == "<|im_start|>") im_start = t["id"] == 151644 && t["special"] == true;
  EXPECT_TRUE(im_start);
}

TEST(ConvertTokenizer, Gpt2VocabUsesPlainByteLevel) {
  MILES_REQUIRE_SHARED();
  auto f = GgufFile::open(test::shared_dir() + "/tokenizers/llama.cpp-vocab/ggml-vocab-gpt-2.gguf");
  ASSERT_TRUE(f.ok()) << f.message();
  auto files = gguf_tokenizer_files(*f);
  ASSERT_TRUE(files.ok()) << files.message();
  const json ours = json::parse(files->tokenizer_json);
  EXPECT_EQ(ours["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(ours["model"]["vocab"].size(), 50257u);
  EXPECT_EQ(ours["model"]["vocab"]["\xc4\xa0"
                                   "the"],
            262);
}

TEST(ConvertTokenizer, SentencePieceIsRefused) {
  MILES_REQUIRE_SHARED();
  auto f =
      GgufFile::open(test::shared_dir() + "/tokenizers/llama.cpp-vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(f.ok()) << f.message();
  auto files = gguf_tokenizer_files(*f);
  ASSERT_FALSE(files.ok());
  EXPECT_NE(files.message().find("'tokenizer.ggml.model' is 'llama'"), std::string::npos)
      << files.message();
}

// What miles convert keeps instead (tokenizer.gguf): the vocabulary's tokenizer.* keys as a
// vocabulary-only GGUF, which encodes every one of llama.cpp's test strings as the original file
// does (and so as llama.cpp: tokenizer_gguf_test checks the original against its vectors).
TEST(ConvertTokenizer, SentencePieceKeptAsAVocabularyOnlyGguf) {
  MILES_REQUIRE_SHARED();
  const std::string vocab = test::shared_dir() + "/tokenizers/llama.cpp-vocab/ggml-vocab-llama-spm";
  auto f = GgufFile::open(vocab + ".gguf");
  ASSERT_TRUE(f.ok()) << f.message();
  std::map<std::string, GgufValue> keys;
  for (const auto& [key, v] : f->metadata())
    if (key.starts_with("tokenizer.")) keys.emplace(key, v);
  auto image = std::make_shared<std::string>(gguf_metadata_image(keys));
  auto kept = GgufFile::parse(reinterpret_cast<const uint8_t*>(image->data()), image->size(),
                              "tokenizer.gguf", image);
  ASSERT_TRUE(kept.ok()) << kept.message();
  auto a = gguf_tokenizer(*f);
  auto b = gguf_tokenizer(*kept);
  ASSERT_TRUE(a.ok() && b.ok()) << a.message() << b.message();
  const std::string inp = read_text(vocab + ".gguf.inp");
  int strings = 0;
  for (size_t at = 0; at < inp.size();) {
    size_t end = inp.find("\n__ggml_vocab_test__\n", at);
    if (end == std::string::npos) end = inp.size();
    const std::string text = inp.substr(at, end - at);
    EXPECT_EQ((*a)->encode(text, true), (*b)->encode(text, true)) << text;
    ++strings;
    at = end + 22;
  }
  EXPECT_GT(strings, 20);
}

TEST(ConvertTokenizer, BadMetadataIsNamed) {
  auto expect_error = [](GgufBuilder b, const std::string& what) {
    auto f = parse(b.build());
    ASSERT_TRUE(f.ok()) << f.message();
    auto t = gguf_tokenizer_files(*f);
    ASSERT_FALSE(t.ok()) << what;
    EXPECT_NE(t.message().find(what), std::string::npos) << t.message();
  };
  auto base = [] {
    GgufBuilder b;
    b.kv_str("tokenizer.ggml.model", "gpt2").kv_strs("tokenizer.ggml.tokens", {"a", "b", "ab"});
    return b;
  };
  expect_error(base().kv_strs("tokenizer.ggml.merges", {"a c"}),
               "'tokenizer.ggml.merges' entry 0 ('a c') uses 'c'");
  expect_error(base().kv_strs("tokenizer.ggml.merges", {"ab"}), "not two tokens joined by a space");
  expect_error(base().kv_strs("tokenizer.ggml.merges", {"a b"}).kv_str("tokenizer.ggml.pre", "x"),
               "'tokenizer.ggml.pre' is 'x'");
  expect_error(
      base().kv_strs("tokenizer.ggml.merges", {"a b"}).kv_i32s("tokenizer.ggml.token_type", {1, 1}),
      "'tokenizer.ggml.token_type' has 2 entries for 3 tokens");
  expect_error(
      base().kv_strs("tokenizer.ggml.merges", {"a b"}).kv_u32("tokenizer.ggml.eos_token_id", 3),
      "'tokenizer.ggml.eos_token_id' is 3, outside the 3-token list");
  expect_error(base(), "'tokenizer.ggml.merges' is missing");
}

TEST(ConvertTokenizer, RespellsTokensOutsideTheByteAlphabetAndAddsBos) {
  GgufBuilder b;
  b.kv_str("tokenizer.ggml.model", "gpt2")
      .kv_strs("tokenizer.ggml.tokens", {"<s>", "a b", "x"})
      .kv_i32s("tokenizer.ggml.token_type", {3, 1, 1})
      .kv_strs("tokenizer.ggml.merges", {})
      .kv_u32("tokenizer.ggml.bos_token_id", 0)
      .kv_bool("tokenizer.ggml.add_bos_token", true);
  auto f = parse(b.build());
  ASSERT_TRUE(f.ok()) << f.message();
  auto files = gguf_tokenizer_files(*f);
  ASSERT_TRUE(files.ok()) << files.message();
  const json tok = json::parse(files->tokenizer_json);
  EXPECT_EQ(tok["model"]["vocab"]["a\xc4\xa0"
                                  "b"],
            1);  // the space spelled as Ġ
  EXPECT_EQ(tok["post_processor"]["single"][0]["SpecialToken"]["id"], "<s>");
  EXPECT_EQ(json::parse(files->tokenizer_config_json)["add_bos_token"], true);
}

}  // namespace
}  // namespace miles
