// `miles tokenize` as a user runs it: ids of a text for each tokenizer format, exact bytes back
// from ids (also ids that split UTF-8 sequences), --add-special, --file, --bench, and bad input
// exiting 1 with a message.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.h"
#include "test_paths.h"

namespace miles {
namespace {

using test::CliRun;
using test::miles_binary;
using test::run_miles;

// Single-quoted for the shell.
std::string quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class TokenizeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(miles_binary())) GTEST_SKIP() << miles_binary() << " is not built";
  }
  static std::string qwen() { return test::shared_dir() + "/tokenizers/qwen3"; }
  static std::string vocab(const char* name) {
    return test::shared_dir() + "/tokenizers/llama.cpp-vocab/ggml-vocab-" + name + ".gguf";
  }
};

TEST_F(TokenizeCli, EncodesWithEveryFormat) {
  MILES_REQUIRE_SHARED();
  // Ids from HF tokenizers / llama.cpp / run.c for the same kind of input.
  CliRun r = run_miles("tokenize --tokenizer " + qwen() + " --text 'Hello world'", false);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "9707 1879\n");
  r = run_miles("tokenize --tokenizer " + qwen() + "/tokenizer.json --text '<|im_start|>user'",
                false);
  EXPECT_EQ(r.out, "151644 872\n");
  r = run_miles("tokenize --tokenizer " + qwen() + " --no-parse-special --text '<|im_start|>user'",
                false);
  EXPECT_EQ(r.out, "27 91 318 4906 91 29 872\n");
  r = run_miles("tokenize --tokenizer " + vocab("gpt-2") + " --text ' Hello world'", false);
  EXPECT_EQ(r.out, "18435 995\n");
  r = run_miles("tokenize --tokenizer " + vocab("llama-spm") + " --text 'Hello world'", false);
  EXPECT_EQ(r.out, "15043 3186\n");
  r = run_miles("tokenize --tokenizer " + vocab("llama-spm") + " --add-special --text 'Hello'",
                false);
  EXPECT_EQ(r.out, "1 15043\n");
  const std::string tok512 = test::shared_dir() + "/models/stories260K/tok512.bin";
  r = run_miles("tokenize --tokenizer " + tok512 + " --add-special --text 'Once upon a time'",
                false);
  EXPECT_EQ(r.out, "1 403 407 261 378\n");
}

TEST_F(TokenizeCli, DecodesIdsToExactBytes) {
  MILES_REQUIRE_SHARED();
  const std::string text = "naïve 🦙\tcode\r\n<|im_end|>";
  CliRun enc = run_miles("tokenize --tokenizer " + qwen() + " --text " + quote(text), false);
  ASSERT_EQ(enc.exit_code, 0);
  CliRun dec = run_miles("tokenize --tokenizer " + qwen() + " --ids " + quote(enc.out), false);
  EXPECT_EQ(dec.exit_code, 0);
  EXPECT_EQ(dec.out, text);
  // U+1E5D0 is four byte tokens; the first two alone are the bytes F0 9E, not valid UTF-8.
  CliRun split = run_miles("tokenize --tokenizer " + qwen() + " --text '\xF0\x9E\x97\x90'", false);
  EXPECT_EQ(split.out, "172 252 245 238\n");
  dec = run_miles("tokenize --tokenizer " + qwen() + " --ids '172 252'", false);
  EXPECT_EQ(dec.out, "\xF0\x9E");
}

TEST_F(TokenizeCli, FileAndBench) {
  MILES_REQUIRE_SHARED();
  const std::string path = testing::TempDir() + "/tokenize_cli.txt";
  std::ofstream(path, std::ios::binary) << "line one\nline two 🦙\n";
  CliRun r = run_miles("tokenize --tokenizer " + qwen() + " --file " + path, false);
  EXPECT_EQ(r.exit_code, 0);
  CliRun t = run_miles(
      "tokenize --tokenizer " + qwen() + " --text " + quote("line one\nline two 🦙\n"), false);
  EXPECT_EQ(r.out, t.out);
  r = run_miles("tokenize --tokenizer " + qwen() + " --file " + path + " --bench", false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["bytes"], 23);
  EXPECT_EQ(j["lines"], 2);
  EXPECT_GT(j["tokens"].get<int>(), 4);
  EXPECT_GT(j["mb_per_s"].get<double>(), 0.0);
}

TEST_F(TokenizeCli, BadInputExitsOneWithAMessage) {
  CliRun r = run_miles("tokenize --tokenizer /no/such/tokenizer.json --text hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("/no/such/tokenizer.json"), std::string::npos) << r.out;
  MILES_REQUIRE_SHARED();
  r = run_miles("tokenize --tokenizer " + qwen() + " --ids '1 2 999999'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("999999"), std::string::npos) << r.out;
  r = run_miles("tokenize --tokenizer " + qwen() + " --ids '1 x'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("'x'"), std::string::npos) << r.out;
  r = run_miles("tokenize --tokenizer " + qwen() + " --text a --ids 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("exactly one"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace miles
