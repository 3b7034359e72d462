// The weight-sync transfer plan: every tensor exactly once, expert and non-expert tensors never
// share a bucket, fused groups (q/k/v, gate/up) never straddle buckets, buckets respect the size
// limit, each bucket belongs to one pipeline stage and is sent by that stage's (dp = 0, tp = 0)
// rank; the plan is a pure function of its inputs.
#include "miles/weight_sync/transfer_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "miles/checkpoint.h"
#include "test_paths.h"

namespace miles {
namespace {

struct Loaded {
  ModelConfig config;
  std::shared_ptr<const ParamLayout> layout;
};

Loaded load(const std::string& name) {
  const std::string dir = test::data_dir() + "/models/" + name;
  auto c = load_model_config(dir + "/config.json");
  EXPECT_TRUE(c.ok()) << c.message();
  auto w = read_hf_weights(dir);
  EXPECT_TRUE(w.ok());
  return {*c, ParamLayout::for_model(*c, &*w)};
}

TEST(TransferPlan, InvariantsHoldForEveryLayoutAndBucketSize) {
  for (const char* model : {"llama", "llama_tied", "qwen3", "qwen3_moe"}) {
    const Loaded m = load(model);
    for (const char* spec : {"dp=1", "dp=2,pp=2,tp=2", "pp=2"}) {
      auto layout = ParallelLayout::parse(spec);
      ASSERT_TRUE(layout.ok());
      for (int64_t limit : {int64_t{1}, int64_t{20000}, int64_t{100000}, int64_t{512} << 20}) {
        auto plan = make_transfer_plan(m.config, *m.layout, *layout, {.bucket_bytes = limit});
        ASSERT_TRUE(plan.ok()) << plan.message();
        // Every tensor once.
        std::multiset<std::string> got;
        for (const auto& n : plan->tensor_names()) got.insert(n);
        std::multiset<std::string> want;
        for (const ParamSpec& s : m.layout->specs()) want.insert(s.name);
        EXPECT_EQ(got, want) << model << " " << spec << " " << limit;
        int64_t total = 0;
        std::map<std::string, size_t> group_bucket;
        for (size_t b = 0; b < plan->buckets.size(); ++b) {
          const Bucket& bk = plan->buckets[b];
          int64_t off = 0;
          std::set<std::string> groups;
          for (const PlannedTensor& t : bk.tensors) {
            EXPECT_EQ(t.offset, off);
            off += t.bytes;
            EXPECT_EQ(t.name.find(".mlp.experts.") != std::string::npos, bk.expert) << t.name;
            const std::string g = fused_group(t.name);
            if (!g.empty()) {
              auto [it, fresh] = group_bucket.emplace(g, b);
              EXPECT_EQ(it->second, b) << g << " straddles buckets";
              groups.insert(g);
            }
          }
          EXPECT_EQ(off, bk.bytes);
          total += bk.bytes;
          // Over the limit only when one fused group (or one tensor) alone is larger.
          if (bk.bytes > limit) {
            bool one_group = groups.size() == 1;
            for (const PlannedTensor& t : bk.tensors)
              one_group = one_group && !fused_group(t.name).empty();
            EXPECT_TRUE(bk.tensors.size() == 1 || one_group) << "bucket " << b << " over the limit";
          }
          EXPECT_EQ(bk.sender, layout->stage_leader(bk.stage));
        }
        EXPECT_EQ(total, plan->total_bytes);
        EXPECT_EQ(total, m.layout->total() * 4);
      }
    }
  }
}

TEST(TransferPlan, StagesSendTheirOwnLayersAndThePlanIsDeterministic) {
  const Loaded m = load("qwen3_moe");
  auto layout = ParallelLayout::parse("pp=2,tp=2");
  ASSERT_TRUE(layout.ok());
  auto a = make_transfer_plan(m.config, *m.layout, *layout, {.bucket_bytes = 50000});
  auto b = make_transfer_plan(m.config, *m.layout, *layout, {.bucket_bytes = 50000});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tensor_names(), b->tensor_names());
  for (const Bucket& bk : a->buckets)
    for (const PlannedTensor& t : bk.tensors) {
      if (t.name.rfind("model.layers.0.", 0) == 0 || t.name == "model.embed_tokens.weight")
        EXPECT_EQ(bk.stage, 0) << t.name;
      if (t.name.rfind("model.layers.1.", 0) == 0 || t.name == "model.norm.weight")
        EXPECT_EQ(bk.stage, 1) << t.name;
    }
  EXPECT_EQ(a->buckets.front().sender, 0);
  EXPECT_EQ(a->buckets.back().sender, 2);  // stage 1 starts at world rank dp·tp = 2
}

TEST(TransferPlan, RejectsBadOptions) {
  const Loaded m = load("llama");
  EXPECT_FALSE(make_transfer_plan(m.config, *m.layout, ParallelLayout{}, {.bucket_bytes = 0}).ok());
  auto pp3 = ParallelLayout::parse("pp=3");
  EXPECT_NE(make_transfer_plan(m.config, *m.layout, *pp3).status().message().find("layers"),
            std::string::npos);
}

}  // namespace
}  // namespace miles
