// Model::load: an HF directory (config.json + safetensors) or a llama2.c checkpoint file.
#include <filesystem>

#include "miles/hf_names.h"
#include "miles/model.h"

namespace miles {

Result<ModelFiles> load_model_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    ModelFiles f;
    MILES_ASSIGN_OR_RETURN(f.config, load_model_config(path + "/config.json"));
    MILES_ASSIGN_OR_RETURN(const TensorMap checkpoint, read_hf_weights(path));
    MILES_ASSIGN_OR_RETURN(f.weights, from_hf_names(f.config, checkpoint));  // Phi-3's fused names
    return f;
  }
  if (fs::is_regular_file(path, ec)) {
    MILES_ASSIGN_OR_RETURN(Llama2cModel ck, read_llama2c(path));
    return ModelFiles{std::move(ck.config), std::move(ck.weights)};
  }
  return Status::Error("model path " + path +
                       " is neither an HF directory nor a llama2.c checkpoint file");
}

Result<std::unique_ptr<Model>> Model::load(const std::string& path) {
  MILES_ASSIGN_OR_RETURN(ModelFiles f, load_model_files(path));
  auto model = from_weights(f.config, f.weights);
  if (!model.ok()) return model.status().with_context("loading model " + path);
  return model;
}

}  // namespace miles
