// Sessions without a model: the store's LRU bound and id rules, and the token record that
// commit_turn builds from synthetic engine answers (loss mask, response-aligned logprobs, weight
// versions, per-turn routed experts of MoE models, and a retry that replaces the last turn).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "miles/rollout/sessions.h"

namespace miles::rollout {
namespace {

using nlohmann::json;

std::vector<int32_t> ids(const json& j) { return j.get<std::vector<int32_t>>(); }

TEST(SessionStore, EvictsTheLeastRecentlyUsedAndChecksIds) {
  SessionStore store(2);
  auto a = store.create("a"), b = store.create("");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE(store.create("a").ok());         // in use
  EXPECT_FALSE(store.create("no/slash").ok());  // not URL-safe
  EXPECT_FALSE(store.create(std::string(129, 'x')).ok());
  ASSERT_NE(store.get("a"), nullptr);   // a is now the most recent
  ASSERT_TRUE(store.create("c").ok());  // drops b
  EXPECT_EQ(store.get(*b), nullptr);
  EXPECT_NE(store.get("a"), nullptr);
  EXPECT_EQ(store.size(), 2u);
  EXPECT_TRUE(store.erase("a"));
  EXPECT_FALSE(store.erase("a"));
}

// MoE records without a model: each turn keeps the experts of the positions it computed first,
// and the trajectory concatenates them into [tokens - 1, layers, top_k]; a retry replaces the
// retried turn's experts and keeps the earlier ones.
TEST(SessionRecord, RoutedExpertsComposePerTurn) {
  constexpr int64_t kPerToken = 4;  // 2 MoE layers x top-2
  auto fin = [](size_t input, std::vector<int32_t> out, int32_t tag) {
    SampleEvent e;
    e.finish_reason = FinishReason::kStop;
    for (int32_t id : out) e.output.push_back({id, -0.5f, -0.25f, 7});
    for (size_t p = 0; p + 1 < input + out.size(); ++p)
      for (int64_t k = 0; k < kPerToken; ++k)
        e.routed_experts.push_back(tag * 1000 + static_cast<int32_t>(p));
    return e;
  };
  Session s;
  TurnPlan p1;
  p1.appended = {10, 11, 12};
  p1.input_ids = p1.appended;
  p1.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  commit_turn(s, p1, fin(3, {20, 21}, 1), {{"role", "assistant"}, {"content", "a"}}, kPerToken);
  TurnPlan p2;
  p2.keep_tokens = 5;
  p2.keep_turns = 1;
  p2.appended = {13};
  p2.input_ids = {10, 11, 12, 20, 21, 13};
  p2.messages = s.conversation;
  p2.messages.push_back({{"role", "user"}, {"content", "more"}});
  commit_turn(s, p2, fin(6, {22, 23}, 2), {{"role", "assistant"}, {"content", "b"}}, kPerToken);
  json t = trajectory_json(s, kPerToken, 2);
  EXPECT_EQ(ids(t["tokens"]), (std::vector<int32_t>{10, 11, 12, 20, 21, 13, 22, 23}));
  EXPECT_EQ(t["loss_mask"], json({0, 0, 0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(t["rollout_logprobs"], json({-0.25, -0.25, 0, -0.25, -0.25}));
  EXPECT_EQ(t["weight_versions"], json({-1, -1, -1, 7, 7, -1, 7, 7}));
  EXPECT_EQ(t["routed_experts_shape"], json({7, 2, 2}));
  std::vector<int32_t> want;  // positions 0-3 from turn 1, 4-6 from turn 2
  for (int32_t p = 0; p < 7; ++p) want.insert(want.end(), kPerToken, (p < 4 ? 1000 : 2000) + p);
  EXPECT_EQ(ids(t["routed_experts"]), want);
  // Retry turn 2 (tag 3): the record keeps turn 1 and its experts.
  TurnPlan r;
  r.retry = true;
  r.keep_turns = 1;
  r.keep_tokens = 6;
  r.input_ids = {10, 11, 12, 20, 21, 13};
  r.messages = p2.messages;
  commit_turn(s, r, fin(6, {24}, 3), {{"role", "assistant"}, {"content", "c"}}, kPerToken);
  t = trajectory_json(s, kPerToken, 2);
  EXPECT_EQ(ids(t["tokens"]), (std::vector<int32_t>{10, 11, 12, 20, 21, 13, 24}));
  EXPECT_EQ(t["turns"][1]["prompt_start"], 5);
  want.clear();
  for (int32_t p = 0; p < 6; ++p) want.insert(want.end(), kPerToken, (p < 4 ? 1000 : 3000) + p);
  EXPECT_EQ(ids(t["routed_experts"]), want);
}

}  // namespace
}  // namespace miles::rollout
