// from_hf_names / to_hf_names (hf_names.h): Phi-3's fused projections split into row views on the
// way in and concatenated on the way out.
#include "miles/hf_names.h"

#include <cstring>
#include <map>
#include <set>

namespace miles {

namespace {

// A fused checkpoint tensor and its parts, each `rows` rows, in row order.
struct Fused {
  std::string fused;
  std::vector<std::pair<std::string, int64_t>> parts;
};

// The fused tensors of one layer (prefix "model.layers.N.").
std::vector<Fused> fused_of_layer(const ModelConfig& c, const std::string& p) {
  if (c.arch != Arch::kPhi3) return {};
  return {{p + "self_attn.qkv_proj.weight",
           {{p + "self_attn.q_proj.weight", c.q_dim()},
            {p + "self_attn.k_proj.weight", c.kv_dim()},
            {p + "self_attn.v_proj.weight", c.kv_dim()}}},
          {p + "mlp.gate_up_proj.weight",
           {{p + "mlp.gate_proj.weight", c.intermediate_size},
            {p + "mlp.up_proj.weight", c.intermediate_size}}}};
}

std::vector<Fused> all_fused(const ModelConfig& c) {
  std::vector<Fused> out;
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (Fused& f : fused_of_layer(c, "model.layers." + std::to_string(l) + "."))
      out.push_back(std::move(f));
  return out;
}

}  // namespace

Result<TensorMap> from_hf_names(const ModelConfig& config, const TensorMap& checkpoint) {
  TensorMap out;
  std::map<std::string, const Fused*> fused_by_name;
  const std::vector<Fused> fused = all_fused(config);
  for (const Fused& f : fused) fused_by_name[f.fused] = &f;
  for (const std::string& name : checkpoint.names()) {
    const Tensor& t = *checkpoint.find(name);
    const std::string& source = checkpoint.source(name);
    auto it = fused_by_name.find(name);
    if (it == fused_by_name.end()) {
      out.insert(name, t, source);
      continue;
    }
    int64_t rows = 0;
    for (const auto& [part, n] : it->second->parts) rows += n;
    if (t.ndim() != 2 || t.dim(0) != rows || t.dim(1) != config.hidden_size)
      return Status::Error(source + ": tensor '" + name + "' has shape " + t.shape_string() +
                           ", expected [" + std::to_string(rows) + ", " +
                           std::to_string(config.hidden_size) + "] for " + config.arch_name);
    int64_t r0 = 0;
    for (const auto& [part, n] : it->second->parts) {
      out.insert(part, t.rows(r0, r0 + n), source);
      r0 += n;
    }
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> to_hf_names(
    const ModelConfig& config, std::vector<std::pair<std::string, Tensor>> tensors) {
  const std::vector<Fused> fused = all_fused(config);
  if (fused.empty()) return tensors;
  std::map<std::string, const Fused*> first_part;  // a fused tensor's first part → it
  std::set<std::string> later_parts;               // written with their first part
  std::map<std::string, const Tensor*> by_name;
  for (const Fused& f : fused) {
    first_part[f.parts.front().first] = &f;
    for (size_t i = 1; i < f.parts.size(); ++i) later_parts.insert(f.parts[i].first);
  }
  for (const auto& [name, t] : tensors) by_name[name] = &t;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : tensors) {
    auto it = first_part.find(name);
    if (it == first_part.end()) {
      if (!later_parts.contains(name)) out.emplace_back(name, t);
      continue;
    }
    const Fused& f = *it->second;
    int64_t rows = 0;
    for (const auto& [part, n] : f.parts) rows += n;
    Tensor whole = Tensor::zeros(t.dtype(), {rows, t.dim(1)});
    auto* dst = whole.mutable_data<uint8_t>();
    for (const auto& [part, n] : f.parts) {
      const Tensor& src = *by_name.at(part);
      MILES_CHECK(src.dim(0) == n && src.dtype() == t.dtype(), "fused parts of one shape");
      std::memcpy(dst, src.raw(), static_cast<size_t>(src.nbytes()));
      dst += src.nbytes();
    }
    out.emplace_back(f.fused, std::move(whole));
  }
  return out;
}

}  // namespace miles
