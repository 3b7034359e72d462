// Model::load: an HF directory (config.json + safetensors) or a llama2.c checkpoint file.
#include <filesystem>

#include "miles/model.h"

namespace miles {

Result<std::unique_ptr<Model>> Model::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    MILES_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(path + "/config.json"));
    MILES_ASSIGN_OR_RETURN(TensorMap weights, read_hf_weights(path));
    auto model = from_weights(config, weights);
    if (!model.ok()) return model.status().with_context("loading model " + path);
    return model;
  }
  if (fs::is_regular_file(path, ec)) {
    MILES_ASSIGN_OR_RETURN(Llama2cModel ck, read_llama2c(path));
    auto model = from_weights(ck.config, ck.weights);
    if (!model.ok()) return model.status().with_context("loading llama2.c checkpoint " + path);
    return model;
  }
  return Status::Error("model path " + path +
                       " is neither an HF directory nor a llama2.c checkpoint file");
}

}  // namespace miles
