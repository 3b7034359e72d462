// What gguf_convert_arch.cc (the shared reading, llama / phi3 / qwen / gemma3) and
// gguf_convert_moe.cc (glm4moe and deepseek2: grouped MoE routing, DeepSeek's MLA) share.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>

#include "miles/gguf.h"
#include "miles/status.h"
#include "model/gguf_convert_arch.h"
#include "nlohmann/json.hpp"

namespace miles::gguf::detail {

// gguf_convert_arch.cc

Result<int64_t> int_or(const GgufFile& f, const std::string& key, int64_t fallback);
Result<double> float_or(const GgufFile& f, const std::string& key, double fallback);
// The shortest decimal spelling of `v` that reads back as it ("30", "0.5").
std::string num(double v);
Status key_error(const GgufFile& f, const std::string& key, const std::string& what);
// `<arch>.vocab_size`, where given, must be token_embd.weight's rows.
Status check_vocab_size(const GgufFile& f, const GgufArch& a);
// Every <arch>.* key of a plain text model that llama.cpp's converter (TextModel) writes, and
// `more`.
std::set<std::string> text_model_keys(std::initializer_list<const char*> more);
// The first `arch`.* key of `f` whose rest is not in `known`, if any.
std::optional<std::string> unknown_key(const GgufFile& f, const std::string& arch,
                                       const std::set<std::string>& known);
// config.json's rope_scaling: null, or the type and factor (and yarn's original context).
nlohmann::ordered_json rope_scaling_json(const GgufArch& a);

// gguf_convert_moe.cc

// DeepSeek's MLA sizes (deepseek2, in place of the plain head size).
Status read_mla(const GgufFile& f, GgufArch* a);
// DeepSeek's yarn (deepseek2, after the rope scaling type and factor are read).
Status read_deepseek2_yarn(const GgufFile& f, GgufArch* a);
// The routing of glm4moe and deepseek2 (after the sizes, embedding and special ids).
Status read_grouped_moe(const GgufFile& f, GgufArch* a);
// config.json's fields after the shared sizes, for glm4moe or deepseek2.
void grouped_moe_config_json(const GgufArch& a, nlohmann::ordered_json& j);

}  // namespace miles::gguf::detail
