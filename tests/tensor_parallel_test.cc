// tensor_parallel: shard configs and the rule that says when a split reproduces the single-process
// forward bit for bit (the sft and check tests run the real split across processes).
#include "miles/tensor_parallel.h"

#include <gtest/gtest.h>

#include "miles/kernels.h"
#include "miles/model_config.h"

namespace miles {
namespace {

// stories260K's shape: dim 64, hidden 172, 8 heads of 8, 4 KV heads, vocab 512.
ModelConfig stories_like() {
  ModelConfig c;
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 172;
  c.num_layers = 5;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 8;
  return c;
}

TEST(TensorParallel, LocalConfigRecordsTheSplit) {
  auto local = tensor_parallel::local_config(stories_like(), 2);
  ASSERT_TRUE(local.ok()) << local.message();
  EXPECT_EQ(local->tensor_parallel, 2);
  EXPECT_EQ(local->num_heads, 4);
  EXPECT_EQ(local->intermediate_size, 86);
  EXPECT_EQ(local->vocab_size, 256);
}

TEST(TensorParallel, BitwiseSplitNamesWhatDoesNotFallOnChunkBoundaries) {
  const ModelConfig c = stories_like();
  EXPECT_TRUE(tensor_parallel::bitwise_split(c, 1).ok());
  EXPECT_TRUE(tensor_parallel::bitwise_split(c, 2).ok());
  EXPECT_TRUE(tensor_parallel::bitwise_split(c, 4).ok());
  Status three = tensor_parallel::bitwise_split(c, 3);
  EXPECT_NE(three.message().find("power of two"), std::string::npos) << three.message();
  // 172 = 4 chunks of 43: eight ranks cannot split it on chunk boundaries.
  Status eight = tensor_parallel::bitwise_split(c, 8);
  EXPECT_NE(eight.message().find("(intermediate_size) = 172"), std::string::npos)
      << eight.message();
  ModelConfig qwen =
      c;  // a 151,936-token vocabulary sums its softmax in chunks of 128: 1187 chunks
  qwen.vocab_size = 151936;
  Status v = tensor_parallel::bitwise_split(qwen, 2);
  EXPECT_NE(v.message().find("vocab_size = 151936"), std::string::npos) << v.message();
  ModelConfig moe = c;
  moe.moe.num_experts = 8;
  moe.moe.top_k = 2;
  moe.moe.moe_intermediate_size = 36;  // 4 chunks of 9
  EXPECT_TRUE(tensor_parallel::bitwise_split(moe, 4).ok());
  EXPECT_FALSE(tensor_parallel::bitwise_split(moe, 8).ok());
}

}  // namespace
}  // namespace miles
