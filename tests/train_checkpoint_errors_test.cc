// Trainer checkpoints that are damaged, incomplete or foreign are refused with an error naming the
// file and the tensor or key, leaving the trainer untouched; latest_checkpoint ignores leftovers of
// crashed saves; an existing checkpoint is only replaced when asked.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "miles/trainer/train_checkpoint.h"
#include "train_checkpoint_case.h"

namespace miles {
namespace {

namespace fs = std::filesystem;
using namespace miles::test;  // NOLINT(google-build-using-namespace)

// A saved llama checkpoint to damage, and a fresh trainer to load it into.
class Damaged : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = load_source("llama");
    auto t = make_trainer(src_);
    train(*t, 0, 2);
    dir_ = tmp_.path() + "/checkpoints/" + checkpoint_dir_name(2);
    ASSERT_TRUE(save_checkpoint(dir_, *t, TrainState{}).ok());
    fresh_ = make_trainer(src_);
    before_ = hashes(*fresh_);
  }
  // The load error; the trainer must be left as it was.
  std::string load_error() {
    auto r = load_checkpoint(dir_, *fresh_);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(hashes(*fresh_), before_);
    EXPECT_EQ(fresh_->steps_done(), 0);
    return r.message();
  }
  // File offset of `tensor`'s first data byte in the safetensors file `path`.
  static int64_t data_offset(const std::string& path, const std::string& tensor) {
    std::ifstream in(path, std::ios::binary);
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, ' ');
    in.read(header.data(), n);
    const size_t at = header.find("\"" + tensor + "\"");
    const size_t off = header.find("data_offsets\":[", at) + 15;
    return 8 + static_cast<int64_t>(n) + std::stoll(header.substr(off));
  }
  static void flip_byte(const std::string& path, int64_t offset) {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(offset);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(offset);
    f.write(&c, 1);
  }
  static std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void write_text(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  }
  void rewrite_state(const std::string& from, const std::string& to) {
    std::string text = read_text(dir_ + "/trainer_state.json");
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    write_text(dir_ + "/trainer_state.json", text.replace(at, from.size(), to));
  }
  // Rewrites model.safetensors through `edit` of its (name, tensor) list.
  template <typename Edit>
  void rewrite_model(Edit edit) {
    auto m = read_safetensors(dir_ + "/model.safetensors");
    ASSERT_TRUE(m.ok());
    std::vector<std::pair<std::string, Tensor>> list;
    for (const std::string& n : m->names()) list.emplace_back(n, *m->find(n));
    edit(list);
    ASSERT_TRUE(write_safetensors(dir_ + "/model.safetensors", list).ok());
  }

  TempDir tmp_;
  Source src_;
  std::string dir_;
  std::unique_ptr<Trainer> fresh_;
  std::vector<std::string> before_;
};

TEST_F(Damaged, TruncatedModelFile) {
  const std::string path = dir_ + "/model.safetensors";
  fs::resize_file(path, fs::file_size(path) / 2);
  EXPECT_NE(load_error().find("model.safetensors"), std::string::npos);
}

TEST_F(Damaged, FlippedByteNamesTheTensor) {
  const std::string t = "model.layers.1.mlp.down_proj.weight";
  flip_byte(dir_ + "/model.safetensors", data_offset(dir_ + "/model.safetensors", t) + 41);
  const std::string e = load_error();
  EXPECT_NE(e.find("model.safetensors: tensor '" + t + "' fails its sha256 check"),
            std::string::npos)
      << e;
}

TEST_F(Damaged, FlippedByteInAMomentNamesIt) {
  const std::string t = "exp_avg_sq.model.layers.0.self_attn.k_proj.weight";
  const std::string path = dir_ + "/optimizer.safetensors";
  flip_byte(path, data_offset(path, t) + 6);
  const std::string e = load_error();
  EXPECT_NE(e.find("optimizer.safetensors: tensor '" + t + "' fails its sha256"), std::string::npos)
      << e;
}

TEST_F(Damaged, MissingStateFileMeansIncomplete) {
  fs::remove(dir_ + "/trainer_state.json");
  EXPECT_NE(load_error().find("trainer_state.json"), std::string::npos);
  EXPECT_FALSE(latest_checkpoint(tmp_.path() + "/checkpoints").ok());
}

TEST_F(Damaged, MissingTensor) {
  rewrite_model([](auto& list) {
    std::erase_if(list, [](const auto& p) { return p.first == "model.norm.weight"; });
  });
  EXPECT_NE(load_error().find("model.safetensors: tensor 'model.norm.weight' is missing"),
            std::string::npos);
}

TEST_F(Damaged, WrongShapeInTheFile) {
  rewrite_model([](auto& list) {
    for (auto& [name, t] : list)
      if (name == "model.norm.weight")
        t = Tensor::view(DType::kF32, {2, t.numel() / 2}, t.raw(), nullptr);
  });
  const std::string e = load_error();
  EXPECT_NE(e.find("tensor 'model.norm.weight' is F32 [2, 32], expected F32 [64]"),
            std::string::npos)
      << e;
}

TEST_F(Damaged, UnexpectedTensor) {
  rewrite_model([](auto& list) { list.emplace_back("extra.weight", list[0].second); });
  EXPECT_NE(load_error().find("unexpected tensor 'extra.weight'"), std::string::npos);
}

TEST_F(Damaged, LayoutRecordedForAnotherModel) {
  rewrite_state("\"shape\": [\n        1024,\n        64",
                "\"shape\": [\n        1000,\n        64");
  const std::string e = load_error();
  EXPECT_NE(e.find("trainer_state.json: key 'tensors[0]' is 'model.embed_tokens.weight' "
                   "[1000,64], the trainer's model has 'model.embed_tokens.weight' [1024,64]"),
            std::string::npos)
      << e;
}

TEST_F(Damaged, WrongFormatVersion) {
  rewrite_state("\"format_version\": 1", "\"format_version\": 2");
  const std::string e = load_error();
  EXPECT_NE(e.find("trainer_state.json: key 'format_version' is 2; this build reads 1"),
            std::string::npos)
      << e;
}

TEST_F(Damaged, NumberBeyondADouble) {  // nlohmann's out_of_range, not a parse_error: no crash
  rewrite_state("\"format_version\": 1", "\"format_version\": 1e999");
  const std::string e = load_error();
  EXPECT_NE(e.find("trainer_state.json: not valid JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("number overflow"), std::string::npos) << e;
}

TEST_F(Damaged, AnotherModelsTrainerIsRefusedByConfig) {
  const Source tied = load_source("llama_tied");
  auto other = make_trainer(tied);
  auto r = load_checkpoint(dir_, *other);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("config.json: key 'tie_word_embeddings'"), std::string::npos)
      << r.message();
}

TEST_F(Damaged, LatestIgnoresTmpAndIncompleteDirectories) {
  const std::string ck = tmp_.path() + "/checkpoints";
  ASSERT_TRUE(save_checkpoint(ck + "/" + checkpoint_dir_name(10), *fresh_, TrainState{}).ok());
  // A crashed save (a .tmp-* directory, complete-looking inside) and a stray incomplete directory.
  fs::copy(dir_, ck + "/step_00000099.tmp-4242", fs::copy_options::recursive);
  fs::copy(dir_, ck + "/step_00000050", fs::copy_options::recursive);
  fs::remove(ck + "/step_00000050/trainer_state.json");
  fs::create_directories(ck + "/notes");
  auto latest = latest_checkpoint(ck);
  ASSERT_TRUE(latest.ok()) << latest.message();
  EXPECT_EQ(fs::path(*latest).filename(), "step_00000010");
  EXPECT_FALSE(latest_checkpoint(tmp_.path() + "/nowhere").ok());
  // No temporary directories are left behind by a successful save.
  for (const auto& e : fs::directory_iterator(ck))
    EXPECT_TRUE(e.path().filename() != "step_00000010.tmp-" + std::to_string(::getpid()));
}

TEST_F(Damaged, ExistingCheckpointIsNotOverwrittenUnlessAsked) {
  const std::string state = read_text(dir_ + "/trainer_state.json");
  TrainState st;
  st.step = 77;
  const Status s = save_checkpoint(dir_, *fresh_, st);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("already exists"), std::string::npos) << s.message();
  EXPECT_EQ(read_text(dir_ + "/trainer_state.json"), state);
  SaveOptions replace;
  replace.overwrite = true;
  ASSERT_TRUE(save_checkpoint(dir_ + "/", *fresh_, st, replace).ok());
  auto again = make_trainer(src_);
  auto loaded = load_checkpoint(dir_, *again);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  EXPECT_EQ(loaded->step, 77);
  EXPECT_EQ(again->steps_done(), 0);
  EXPECT_EQ(hashes(*again), before_);
  EXPECT_EQ(
      std::distance(fs::directory_iterator(fs::path(dir_).parent_path()), fs::directory_iterator()),
      1)
      << "no .tmp-* or .old-* left next to the checkpoint";
}

TEST_F(Damaged, BadExtraJsonIsRefusedAtSave) {
  TrainState st;
  st.extra_json = "{not json";
  const Status s = save_checkpoint(tmp_.path() + "/x", *fresh_, st);
  EXPECT_NE(s.message().find("extra_json"), std::string::npos);
  EXPECT_FALSE(fs::exists(tmp_.path() + "/x"));
}

}  // namespace
}  // namespace miles
