// ModelConfig parsing: HF config.json spellings, defaults, RoPE variants, MoE layer rules, and
// errors that name the file and the key.
#include "miles/model_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_paths.h"

namespace miles {
namespace {

constexpr const char* kSrc = "/models/x/config.json";

const char* kLlama = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 512, "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 5,
  "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 512,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null,
  "bos_token_id": 1, "eos_token_id": 2, "head_dim": null})";

const char* kQwen3Moe = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
  "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 32, "rope_theta": 1000000.0, "tie_word_embeddings": false,
  "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": true,
  "decoder_sparse_step": 2, "mlp_only_layers": [3], "eos_token_id": [151645, 151643],
  "use_sliding_window": false, "sliding_window": null})";

// kLlama with `key` replaced (or added) by the JSON value `value`.
std::string llama_with(const std::string& key, const std::string& value) {
  std::string s = kLlama;
  const std::string k = "\"" + key + "\": ";
  auto pos = s.find(k);
  if (pos == std::string::npos) return s.substr(0, s.size() - 1) + ", " + k + value + "}";
  auto end = s.find_first_of(",}", pos + k.size());
  if (s[pos + k.size()] == '[') end = s.find(']', pos) + 1;
  return s.substr(0, pos + k.size()) + value + s.substr(end);
}

// kLlama as another family: its architectures and model_type.
std::string family(const std::string& cls, const std::string& type) {
  std::string s = llama_with("architectures", "[\"" + cls + "\"]");
  return s.replace(s.find("\"llama\""), 7, "\"" + type + "\"");
}

// `text` (one JSON object) with `key` added.
std::string with_key(const std::string& text, const std::string& key, const std::string& value) {
  return text.substr(0, text.size() - 1) + ", \"" + key + "\": " + value + "}";
}

void expect_error(const std::string& text, const std::string& needle) {
  auto r = parse_model_config(text, kSrc);
  ASSERT_FALSE(r.ok()) << "expected an error mentioning " << needle;
  EXPECT_NE(r.message().find(kSrc), std::string::npos) << r.message();
  EXPECT_NE(r.message().find(needle), std::string::npos) << r.message();
}

TEST(ModelConfig, LlamaFieldsAndDefaults) {
  auto r = parse_model_config(kLlama, kSrc);
  ASSERT_TRUE(r.ok()) << r.message();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.arch_name, "LlamaForCausalLM");
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);  // null -> hidden / heads
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope.type, RopeConfig::Type::kDefault);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rotary_dim(), 8);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_EQ(c.num_moe_layers(), 0);
  EXPECT_FALSE(c.is_moe_layer(1));
  EXPECT_EQ(c.q_dim(), 64);
  EXPECT_EQ(c.kv_dim(), 32);
}

TEST(ModelConfig, KvHeadsDefaultToHeadsAndModelTypeFallback) {
  auto r = parse_model_config(R"({"model_type": "qwen3", "vocab_size": 10, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4})",
                              kSrc);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->arch, Arch::kQwen3);
  EXPECT_EQ(r->arch_name, "Qwen3ForCausalLM");
  EXPECT_EQ(r->num_kv_heads, 4);
  EXPECT_EQ(r->head_dim, 8);
  EXPECT_DOUBLE_EQ(r->rope.theta, 10000.0);
  EXPECT_TRUE(r->eos_token_ids.empty());
}

// Qwen2 / Qwen2.5: q/k/v biases always (its config has no attention_bias), none on o_proj, no mlp
// biases; transformers 5's layer_types must all be full attention.
TEST(ModelConfig, Qwen2HasQkvBiasesAndFullAttentionOnly) {
  const std::string q2 = family("Qwen2ForCausalLM", "qwen2");
  auto r = parse_model_config(q2, kSrc);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->arch, Arch::kQwen2);
  EXPECT_TRUE(r->attention_bias);
  EXPECT_EQ(r->max_position_embeddings, 512);
  auto by_type = parse_model_config(R"({"model_type": "qwen2", "vocab_size": 8, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2})",
                                    kSrc);
  ASSERT_TRUE(by_type.ok()) << by_type.message();
  EXPECT_EQ(by_type->arch, Arch::kQwen2);
  auto with = [&](const std::string& key, const std::string& value) {
    return with_key(q2, key, value);
  };
  EXPECT_TRUE(
      parse_model_config(with("layer_types", R"(["full_attention", "full_attention"])"), kSrc)
          .ok());
  expect_error(with("layer_types", R"(["full_attention", "sliding_attention"])"),
               "layer_types' [1]");
  auto ignored = parse_model_config(with("attention_bias", "false"), kSrc);  // as transformers does
  ASSERT_TRUE(ignored.ok()) << ignored.message();
  EXPECT_TRUE(ignored->attention_bias);
  expect_error(with("mlp_bias", "true"), "mlp_bias");
  expect_error(with("use_sliding_window", "true"), "use_sliding_window");
}

// Mistral: Llama's fields and a sliding window on every layer (MistralConfig's 4096 when absent,
// none when null); no biases, no layer_types (transformers ignores them); the writer round trips.
TEST(ModelConfig, MistralSlidingWindowOnEveryLayer) {
  const std::string m = family("MistralForCausalLM", "mistral");
  auto with = [&](const std::string& key, const std::string& value) {
    return with_key(m, key, value);
  };
  auto absent = parse_model_config(m, kSrc);
  ASSERT_TRUE(absent.ok()) << absent.message();
  EXPECT_EQ(absent->arch, Arch::kMistral);
  EXPECT_EQ(absent->sliding_window, 4096);
  EXPECT_EQ(absent->attention_window(1), 4096);
  auto none = parse_model_config(with("sliding_window", "null"), kSrc);
  ASSERT_TRUE(none.ok()) << none.message();
  EXPECT_EQ(none->attention_window(0), 0);
  auto five = parse_model_config(with("sliding_window", "5"), kSrc);
  ASSERT_TRUE(five.ok()) << five.message();
  EXPECT_EQ(five->attention_window(0), 5);
  auto back = parse_model_config(model_config_to_hf_json(*five), kSrc);
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_EQ(back->arch, Arch::kMistral);
  EXPECT_EQ(back->sliding_window, 5);
  auto none_back = parse_model_config(model_config_to_hf_json(*none), kSrc);
  ASSERT_TRUE(none_back.ok()) << none_back.message();
  EXPECT_EQ(none_back->sliding_window, 0);
  expect_error(with("sliding_window", "0"), "sliding_window' is 0");
  expect_error(with("layer_types", R"(["sliding_attention", "sliding_attention"])"),
               "layer_types' is given");
  expect_error(with("attention_bias", "true"), "has no biases");
  // Llama and the Qwen families keep refusing windows.
  expect_error(llama_with("layer_types", R"(["full_attention", "sliding_attention"])"),
               "layer_types' [1]");
}

// Phi-3: no window unless sliding_window is given (Phi3Config's default), dropout 0 only, its
// longrope scaling (and the su / yarn names Phi3Config maps to it) refused; the writer round trips
// the partial rotary factor and the window.
TEST(ModelConfig, Phi3WindowDropoutAndRope) {
  const std::string m = family("Phi3ForCausalLM", "phi3");
  auto with = [&](const std::string& key, const std::string& value) {
    return with_key(m, key, value);
  };
  auto plain = parse_model_config(m, kSrc);
  ASSERT_TRUE(plain.ok()) << plain.message();
  EXPECT_EQ(plain->arch, Arch::kPhi3);
  EXPECT_EQ(plain->sliding_window, 0);
  auto windowed = parse_model_config(
      with("sliding_window", "2047").replace(0, 1, R"({"partial_rotary_factor": 0.75, )"), kSrc);
  ASSERT_TRUE(windowed.ok()) << windowed.message();
  EXPECT_EQ(windowed->attention_window(3), 2047);
  EXPECT_EQ(windowed->rotary_dim(), 6);  // head_dim 8 × 0.75
  auto back = parse_model_config(model_config_to_hf_json(*windowed), kSrc);
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_EQ(back->arch, Arch::kPhi3);
  EXPECT_EQ(back->sliding_window, 2047);
  EXPECT_EQ(back->rotary_dim(), 6);
  EXPECT_TRUE(parse_model_config(with("resid_pdrop", "0.0"), kSrc).ok());
  expect_error(with("resid_pdrop", "0.1"), "resid_pdrop");
  expect_error(with("embd_pdrop", "0.1"), "embd_pdrop");
  expect_error(with("rope_parameters", R"({"rope_type": "longrope", "rope_theta": 10000.0})"),
               "longrope");
  expect_error(with("rope_parameters", R"({"rope_type": "yarn", "factor": 2.0})"), "longrope");
  expect_error(with("mlp_bias", "true"), "has no biases");
}

// GLM-4 MoE (glm4_moe): Glm4MoeConfig's defaults where keys are absent (128 experts, 8 per token, a
// shared expert, the first layer dense, half of each head rotated, eps 1e-5), the routing checks,
// the keys it ignores refused, and the writer's round trip.
TEST(ModelConfig, Glm4MoeDefaultsRoutingChecksAndRoundTrip) {
  const std::string m = family("Glm4MoeForCausalLM", "glm4_moe");
  auto with = [&](const std::string& key, const std::string& value) {
    return with_key(m, key, value);
  };
  auto plain = parse_model_config(m, kSrc);
  ASSERT_TRUE(plain.ok()) << plain.message();
  const ModelConfig& c = *plain;
  EXPECT_EQ(c.arch, Arch::kGlm4Moe);
  EXPECT_EQ(c.moe.score, RouterScore::kSigmoid);
  EXPECT_EQ(c.moe.num_experts, 128);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.moe.n_shared_experts, 1);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_EQ(c.num_moe_layers(), c.num_layers - 1);
  EXPECT_EQ(c.rotary_dim(), c.head_dim / 2);
  EXPECT_FALSE(c.has_qk_norm());
  EXPECT_TRUE(parse_model_config(with("use_qk_norm", "true"), kSrc)->has_qk_norm());
  const std::string grouped = with_key(
      with_key(
          with_key(with_key(with("n_routed_experts", "16"), "n_group", "4"), "topk_group", "2"),
          "routed_scaling_factor", "2.5"),
      "first_k_dense_replace", "0");
  auto g = parse_model_config(grouped, kSrc);
  ASSERT_TRUE(g.ok()) << g.message();
  EXPECT_EQ(g->moe.n_group, 4);
  EXPECT_EQ(g->moe.topk_group, 2);
  EXPECT_EQ(g->moe.routed_scaling_factor, 2.5);
  EXPECT_TRUE(g->is_moe_layer(0));
  auto back = parse_model_config(model_config_to_hf_json(*g), kSrc);
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_EQ(back->arch, Arch::kGlm4Moe);
  EXPECT_EQ(back->moe.num_experts, 16);
  EXPECT_EQ(back->moe.n_group, 4);
  EXPECT_EQ(back->moe.topk_group, 2);
  EXPECT_EQ(back->moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(back->moe.first_k_dense_replace, 0);
  EXPECT_EQ(back->moe.n_shared_experts, 1);
  EXPECT_EQ(back->rotary_dim(), g->rotary_dim());
  EXPECT_EQ(back->rms_norm_eps, g->rms_norm_eps);
  expect_error(with("n_group", "3"), "n_group");        // 128 experts do not split in 3
  expect_error(with("topk_group", "2"), "topk_group");  // of n_group 1
  expect_error(with_key(with("n_group", "64"), "topk_group", "1"), "num_experts_per_tok");
  expect_error(with("n_group", "128"), "best two");  // one expert per group
  expect_error(with("routed_scaling_factor", "0"), "routed_scaling_factor");
  expect_error(with("decoder_sparse_step", "2"), "first_k_dense_replace");
  expect_error(with("mlp_bias", "true"), "mlp_bias");
  expect_error(with("hidden_act", "\"gelu\""), "hidden_act");
}

// DeepSeek-V3 (deepseek_v3): DeepseekV3Config's defaults where keys are absent (MLA ranks and head
// dims, 256 experts in 8 groups, 3 dense layers, scale 2.5), the attention geometry MLA runs with
// (one latent kv head of qk_rope + kv_lora), its scale (yarn's mscale² with mscale_all_dim), the
// refusals, and the writer's round trip.
TEST(ModelConfig, DeepseekV3MlaDefaultsGeometryAndRoundTrip) {
  std::string m = family("DeepseekV3ForCausalLM", "deepseek_v3");
  m = with_key(m, "num_key_value_heads", "8");  // = num_attention_heads (kLlama's is 4)
  auto with = [&](const std::string& key, const std::string& value) {
    return with_key(m, key, value);
  };
  auto plain = parse_model_config(m, kSrc);
  ASSERT_TRUE(plain.ok()) << plain.message();
  const ModelConfig& c = *plain;
  EXPECT_EQ(c.arch, Arch::kDeepseekV3);
  EXPECT_TRUE(c.is_mla());
  EXPECT_EQ(c.mla.q_lora_rank, 1536);
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 64 + 512);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_EQ(c.attention_scale(), static_cast<float>(1.0 / std::sqrt(192.0)));
  EXPECT_EQ(c.moe.num_experts, 256);
  EXPECT_EQ(c.moe.n_group, 8);
  EXPECT_EQ(c.moe.topk_group, 4);
  EXPECT_EQ(c.moe.routed_scaling_factor, 2.5);
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  auto noq = parse_model_config(with("q_lora_rank", "null"), kSrc);
  ASSERT_TRUE(noq.ok()) << noq.message();
  EXPECT_EQ(noq->mla.q_lora_rank, 0);
  std::string yarn = m;
  const std::string null_scaling = "\"rope_scaling\": null";
  yarn.replace(yarn.find(null_scaling), null_scaling.size(),
               R"("rope_scaling": {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                  "mscale_all_dim": 1.0, "original_max_position_embeddings": 128})");
  auto y = parse_model_config(yarn, kSrc);
  ASSERT_TRUE(y.ok()) << y.message();
  const double ms = 0.1 * std::log(40.0) + 1.0;
  EXPECT_EQ(y->attention_scale(), static_cast<float>(std::pow(192.0, -0.5) * ms * ms));
  for (const ModelConfig& x : {*y, *noq}) {
    auto back = parse_model_config(model_config_to_hf_json(x), kSrc);
    ASSERT_TRUE(back.ok()) << back.message();
    EXPECT_EQ(back->arch, Arch::kDeepseekV3);
    EXPECT_EQ(back->mla.q_lora_rank, x.mla.q_lora_rank);
    EXPECT_EQ(back->mla.kv_lora_rank, x.mla.kv_lora_rank);
    EXPECT_EQ(back->mla.v_head_dim, x.mla.v_head_dim);
    EXPECT_EQ(back->mla.num_key_value_heads, 8);
    EXPECT_EQ(back->head_dim, x.head_dim);
    EXPECT_EQ(back->attention_scale(), x.attention_scale());
    EXPECT_EQ(back->moe.n_group, x.moe.n_group);
  }
  expect_error(family("DeepseekV3ForCausalLM", "deepseek_v3"), "num_key_value_heads");
  expect_error(with("attention_bias", "true"), "attention_bias");
  expect_error(with("qk_rope_head_dim", "7"), "qk_rope_head_dim");
  expect_error(with("topk_method", "\"greedy\""), "topk_method");
  expect_error(with("scoring_func", "\"softmax\""), "scoring_func");
  expect_error(with("kv_lora_rank", "0"), "kv_lora_rank");
}

// Gemma 3 (gemma3_text): its defaults (head_dim 256, tied, query_pre_attn_scalar 256, window 4096,
// every sixth layer full), the window per layer from layer_types or sliding_window_pattern, the two
// RoPEs in both spellings, the refusals, and the writer's round trip.
TEST(ModelConfig, Gemma3LayersRopesAndRefusals) {
  const std::string m = family("Gemma3ForCausalLM", "gemma3_text");
  auto with = [&](const std::string& key, const std::string& value) {
    return with_key(m, key, value);
  };
  auto plain = parse_model_config(m, kSrc);
  ASSERT_TRUE(plain.ok()) << plain.message();
  const ModelConfig& c = *plain;
  EXPECT_EQ(c.arch, Arch::kGemma3);
  EXPECT_EQ(c.activation, Activation::kGeluTanh);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.norm_adds_one() && c.has_block_output_norms() && c.has_qk_norm());
  EXPECT_EQ(c.attention_scale(), 0.0625f);  // 256^-1/2
  EXPECT_EQ(c.embed_scale(), 8.0f);         // sqrt(64)
  EXPECT_EQ(c.sliding_window, 4096);
  for (int l = 0; l < 5; ++l) EXPECT_EQ(c.attention_window(l), 4096) << l;  // pattern 6: no full
  EXPECT_EQ(c.rope.theta, 10000.0);  // the file's rope_theta (the full layers')
  EXPECT_EQ(c.rope_local.theta, 10000.0);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.pad_token_id, 0);  // Gemma3TextConfig's default: its embedding's padding_idx
  auto padded = parse_model_config(llama_with("pad_token_id", "7"), kSrc);
  ASSERT_TRUE(padded.ok());
  EXPECT_EQ(padded->pad_token_id, 7);
  EXPECT_EQ(parse_model_config(model_config_to_hf_json(*padded), kSrc)->pad_token_id, 7);
  EXPECT_EQ(parse_model_config(kLlama, kSrc)->pad_token_id, -1);
  auto pattern = parse_model_config(with("sliding_window_pattern", "2"), kSrc);
  ASSERT_TRUE(pattern.ok()) << pattern.message();
  for (int l = 0; l < 5; ++l) {
    EXPECT_EQ(pattern->attention_window(l), l % 2 == 1 ? 0 : 4096) << l;
    EXPECT_EQ(pattern->uses_local_rope(l), l % 2 == 0) << l;
  }
  const std::string types =
      R"(["full_attention", "sliding_attention", "full_attention", "full_attention",
          "sliding_attention"])";
  const std::string v5 = with_key(
      with_key(with("layer_types", types), "sliding_window", "512"), "rope_parameters",
      R"({"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})");
  auto typed = parse_model_config(v5, kSrc);
  ASSERT_TRUE(typed.ok()) << typed.message();
  EXPECT_EQ(typed->attention_window(0), 0);
  EXPECT_EQ(typed->attention_window(1), 512);
  EXPECT_EQ(typed->rope.type, RopeConfig::Type::kLinear);
  EXPECT_EQ(typed->rope.factor, 8.0);
  EXPECT_EQ(typed->rope.theta, 1e6);
  EXPECT_EQ(typed->rope_local.type, RopeConfig::Type::kDefault);
  for (const ModelConfig& x : {*typed, *pattern}) {
    auto back = parse_model_config(model_config_to_hf_json(x), kSrc);
    ASSERT_TRUE(back.ok()) << back.message();
    EXPECT_EQ(back->arch, Arch::kGemma3);
    EXPECT_EQ(back->sliding_layers, x.sliding_layers);
    EXPECT_EQ(back->sliding_window, x.sliding_window);
    EXPECT_EQ(back->rope.type, x.rope.type);
    EXPECT_EQ(back->rope.factor, x.rope.factor);
    EXPECT_EQ(back->rope.theta, x.rope.theta);
    EXPECT_EQ(back->rope_local.theta, x.rope_local.theta);
    EXPECT_EQ(back->query_pre_attn_scalar, x.query_pre_attn_scalar);
    EXPECT_EQ(back->head_dim, x.head_dim);
  }
  auto scalar = parse_model_config(with("query_pre_attn_scalar", "144"), kSrc);
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(scalar->attention_scale(), static_cast<float>(1.0 / 12.0));
  expect_error(with("final_logit_softcapping", "30.0"), "final_logit_softcapping");
  expect_error(with("attn_logit_softcapping", "50.0"), "attn_logit_softcapping");
  expect_error(with("use_bidirectional_attention", "true"), "use_bidirectional_attention");
  expect_error(with("hidden_activation", "\"gelu\""), "hidden_activation");
  expect_error(with("attention_bias", "true"), "attention_bias");
  expect_error(with("partial_rotary_factor", "0.5"), "partial_rotary_factor");
  expect_error(with("layer_types", R"(["full_attention"])"), "layer_types");
  expect_error(with("layer_types", R"(["full_attention", "chunked_attention", "full_attention",
               "full_attention", "full_attention"])"),
               "layer_types' [1]");
  expect_error(with("rope_parameters", R"({"global": {"rope_type": "default"}})"), "global");
  expect_error(with("sliding_window", "0"), "sliding_window");
  std::string multimodal = m;
  multimodal.replace(multimodal.find("\"gemma3_text\""), 13, "\"gemma3\"");
  expect_error(multimodal, "multimodal");
  expect_error(family("Gemma3ForConditionalGeneration", "gemma3"),
               "Gemma3ForConditionalGeneration");
}

// The token ids over the family's defaults: null is transformers' None and overrides a default
// (Gemma 3's bos 2, eos 1, pad 0), and the writer keeps it (left out, the default came back: the
// model_json fuzzer's find); negative ids are refused, except pad_token_id, torch's padding_idx,
// which counts from the end of the vocabulary.
TEST(ModelConfig, TokenIdsNullOverridesDefaultsAndNegativePadCountsFromTheEnd) {
  nlohmann::json gemma = nlohmann::json::parse(family("Gemma3ForCausalLM", "gemma3_text"));
  gemma.erase("bos_token_id");
  gemma.erase("eos_token_id");
  auto parse = [](const nlohmann::json& j) { return parse_model_config(j.dump(), kSrc); };
  auto defaults = parse(gemma);
  ASSERT_TRUE(defaults.ok()) << defaults.message();
  EXPECT_EQ(defaults->bos_token_id, 2);
  EXPECT_EQ(defaults->eos_token_ids, std::vector<int64_t>{1});
  EXPECT_EQ(defaults->pad_token_id, 0);
  nlohmann::json none = gemma;
  none["bos_token_id"] = nullptr;
  none["eos_token_id"] = nullptr;
  none["pad_token_id"] = nullptr;
  auto n = parse(none);
  ASSERT_TRUE(n.ok()) << n.message();
  EXPECT_EQ(n->bos_token_id, -1);
  EXPECT_TRUE(n->eos_token_ids.empty());
  EXPECT_EQ(n->pad_token_id, -1);
  auto back = parse_model_config(model_config_to_hf_json(*n), kSrc);
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_EQ(back->bos_token_id, -1);
  EXPECT_TRUE(back->eos_token_ids.empty());
  EXPECT_EQ(back->pad_token_id, -1);
  EXPECT_EQ(model_config_to_hf_json(*back), model_config_to_hf_json(*n));

  auto last = parse_model_config(llama_with("pad_token_id", "-1"), kSrc);  // vocab_size 512
  ASSERT_TRUE(last.ok()) << last.message();
  EXPECT_EQ(last->pad_token_id, 511);
  EXPECT_EQ(parse_model_config(llama_with("pad_token_id", "-512"), kSrc)->pad_token_id, 0);
  EXPECT_EQ(parse_model_config(model_config_to_hf_json(*last), kSrc)->pad_token_id, 511);
  expect_error(llama_with("pad_token_id", "-513"), "pad_token_id' is -513");
  expect_error(llama_with("pad_token_id", "512"), "[-512, 512)");
  expect_error(llama_with("bos_token_id", "-1"), "bos_token_id' is -1");
  expect_error(llama_with("eos_token_id", "[2, -1]"), "eos_token_id' holds -1");
}

TEST(ModelConfig, Qwen3MoeLayers) {
  auto r = parse_model_config(kQwen3Moe, kSrc);
  ASSERT_TRUE(r.ok()) << r.message();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.arch, Arch::kQwen3Moe);
  EXPECT_EQ(c.head_dim, 32);  // explicit, not hidden / heads
  EXPECT_EQ(c.q_dim(), 128);
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.moe_intermediate_size, 32);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  // step 2: layers 1, 3, 5 are sparse, except 3 (mlp_only_layers).
  const bool expected[] = {false, true, false, false, false, true};
  for (int l = 0; l < 6; ++l) EXPECT_EQ(c.is_moe_layer(l), expected[l]) << "layer " << l;
  EXPECT_EQ(c.num_moe_layers(), 2);

  std::string v5 = kQwen3Moe;  // transformers v5 spelling
  v5.replace(v5.find("\"num_experts\""), 13, "\"num_local_experts\"");
  auto r5 = parse_model_config(v5, kSrc);
  ASSERT_TRUE(r5.ok()) << r5.message();
  EXPECT_EQ(r5->moe.num_experts, 8);
}

TEST(ModelConfig, RopeScalingVariants) {
  auto llama3 = parse_model_config(
      llama_with("rope_scaling", R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
      kSrc);
  ASSERT_TRUE(llama3.ok()) << llama3.message();
  EXPECT_EQ(llama3->rope.type, RopeConfig::Type::kLlama3);
  EXPECT_DOUBLE_EQ(llama3->rope.factor, 8.0);
  EXPECT_EQ(llama3->rope.original_max_position_embeddings, 8192);

  auto linear =
      parse_model_config(llama_with("rope_scaling", R"({"type": "linear", "factor": 2})"), kSrc);
  ASSERT_TRUE(linear.ok()) << linear.message();
  EXPECT_EQ(linear->rope.type, RopeConfig::Type::kLinear);
  EXPECT_DOUBLE_EQ(linear->rope.factor, 2.0);

  auto dynamic =
      parse_model_config(llama_with("rope_scaling", R"({"type": "dynamic", "factor": 2})"), kSrc);
  ASSERT_TRUE(dynamic.ok()) << dynamic.message();
  EXPECT_EQ(dynamic->rope.type, RopeConfig::Type::kDynamic);
  EXPECT_EQ(dynamic->rope.max_position_embeddings, 512);

  auto yarn = parse_model_config(
      llama_with("rope_scaling", R"({"rope_type": "yarn", "factor": 4.0, "beta_fast": 16,
          "beta_slow": 2, "attention_factor": 1.5, "mscale": 0.7, "mscale_all_dim": 0.5,
          "truncate": false, "original_max_position_embeddings": 128})"),
      kSrc);
  ASSERT_TRUE(yarn.ok()) << yarn.message();
  EXPECT_EQ(yarn->rope.type, RopeConfig::Type::kYarn);
  EXPECT_DOUBLE_EQ(yarn->rope.beta_fast, 16);
  EXPECT_DOUBLE_EQ(yarn->rope.beta_slow, 2);
  EXPECT_DOUBLE_EQ(yarn->rope.attention_factor, 1.5);
  EXPECT_DOUBLE_EQ(yarn->rope.mscale, 0.7);
  EXPECT_DOUBLE_EQ(yarn->rope.mscale_all_dim, 0.5);
  EXPECT_FALSE(yarn->rope.truncate);
  EXPECT_EQ(yarn->rope.original_max_position_embeddings, 128);
}

TEST(ModelConfig, RopeParametersV5AndPartialRotary) {
  auto r = parse_model_config(
      llama_with("rope_parameters",
                 R"({"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0,
                     "partial_rotary_factor": 0.5})"),
      kSrc);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->rope.type, RopeConfig::Type::kLinear);
  EXPECT_DOUBLE_EQ(r->rope.theta, 500000.0);
  EXPECT_EQ(r->rotary_dim(), 4);

  auto top = parse_model_config(llama_with("partial_rotary_factor", "0.5"), kSrc);
  ASSERT_TRUE(top.ok()) << top.message();
  EXPECT_EQ(top->rotary_dim(), 4);
  expect_error(llama_with("partial_rotary_factor", "0.375"), "partial_rotary_factor");  // 3: odd
  expect_error(llama_with("partial_rotary_factor", "1.5"), "partial_rotary_factor");
}

TEST(ModelConfig, Errors) {
  expect_error(llama_with("architectures", R"(["GPT2LMHeadModel"])"), "GPT2LMHeadModel");
  expect_error(llama_with("architectures", R"(["Gemma3ForCausalLM"])"), "Gemma3ForCausalLM");
  expect_error("[1, 2]", "JSON object");
  expect_error("{\"hidden_size\": ", "not valid JSON");
  expect_error(llama_with("rope_theta", "1e999"), "not valid JSON");  // beyond a double
  expect_error(llama_with("hidden_size", "\"64\""), "hidden_size");
  expect_error(llama_with("hidden_size", "64.5"), "hidden_size");
  expect_error(llama_with("hidden_size", "-64"), "hidden_size");
  expect_error(llama_with("num_hidden_layers", "0"), "num_hidden_layers");
  expect_error(llama_with("vocab_size", "1e30"), "vocab_size");
  expect_error(llama_with("num_attention_heads", "7"), "num_attention_heads");  // 64 % 7
  expect_error(llama_with("num_key_value_heads", "3"), "num_key_value_heads");
  expect_error(llama_with("tie_word_embeddings", "1"), "tie_word_embeddings");
  expect_error(llama_with("eos_token_id", "\"</s>\""), "eos_token_id");
  expect_error(llama_with("rope_scaling", R"({"rope_type": "ntk-magic", "factor": 2})"),
               "ntk-magic");
  expect_error(llama_with("rope_scaling", R"({"rope_type": "linear"})"), "rope_scaling.factor");
  expect_error(llama_with("rope_scaling", R"({"rope_type": "llama3", "factor": 8})"),
               "low_freq_factor");
  expect_error(llama_with("rope_scaling", "\"linear\""), "rope_scaling");
  expect_error(llama_with("head_dim", "7"), "partial_rotary_factor");  // odd rotary_dim
  expect_error(llama_with("use_sliding_window", "true"), "use_sliding_window");
  // Fields that change the numbers are implemented or refused by name, never dropped.
  EXPECT_TRUE(parse_model_config(llama_with("mlp_bias", "true"), kSrc).ok());  // implemented
  expect_error(llama_with("hidden_act", "\"gelu_pytorch_tanh\""), "hidden_act");
  expect_error(llama_with("attention_dropout", "0.1"), "attention_dropout");
  expect_error(llama_with("output_router_logits", "true"), "output_router_logits");
  EXPECT_TRUE(parse_model_config(llama_with("attention_dropout", "0.0"), kSrc).ok());
  EXPECT_TRUE(parse_model_config(llama_with("mlp_bias", "false"), kSrc).ok());

  std::string no_hidden = kLlama;
  no_hidden.erase(no_hidden.find("\"hidden_size\": 64,"), 18);
  expect_error(no_hidden, "hidden_size");
  std::string moe = kQwen3Moe;
  moe.replace(moe.find("\"num_experts_per_tok\": 2"), 24, "\"num_experts_per_tok\": 9");
  expect_error(moe, "num_experts_per_tok");
  moe = kQwen3Moe;
  moe.replace(moe.find("\"mlp_only_layers\": [3]"), 22, "\"mlp_only_layers\": [6]");
  expect_error(moe, "mlp_only_layers");
}

TEST(ModelConfig, LoadFromFileNamesPath) {
  auto missing = load_model_config("/nonexistent/config.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("/nonexistent/config.json"), std::string::npos);
}

// Every tiny HF model generated under tests/data/models parses and validates.
TEST(ModelConfig, TestDataModels) {
  const std::filesystem::path root = test::data_dir() + "/models";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << root << " not present";
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    const auto path = entry.path() / "config.json";
    if (!std::filesystem::exists(path)) continue;
    auto r = load_model_config(path.string());
    EXPECT_TRUE(r.ok()) << r.message();
    if (!r.ok()) continue;
    const std::string name = entry.path().filename().string();
    if (name == "qwen3_moe") {
      EXPECT_EQ(r->arch, Arch::kQwen3Moe);
      EXPECT_EQ(r->moe.num_experts, 8);
      EXPECT_EQ(r->num_moe_layers(), r->num_layers);
    }
    if (name == "glm4_moe") {
      EXPECT_EQ(r->arch, Arch::kGlm4Moe);
      EXPECT_EQ(r->moe.n_group, 2);
      EXPECT_EQ(r->num_moe_layers(), r->num_layers - 1);
      EXPECT_TRUE(r->has_qk_norm());
    }
    if (name == "llama_rope_llama3") {
      EXPECT_EQ(r->rope.type, RopeConfig::Type::kLlama3);
      EXPECT_DOUBLE_EQ(r->rope.theta, 500000.0);
    }
    if (name == "llama_rope_yarn") {
      EXPECT_EQ(r->rope.type, RopeConfig::Type::kYarn);
    }
    if (name == "llama_tied") {
      EXPECT_TRUE(r->tie_word_embeddings);
    }
    ++n;
  }
  if (n == 0) GTEST_SKIP() << "no config.json under " << root;
}

}  // namespace
}  // namespace miles
