// One engine iteration: schedule (running decodes first, then prefill chunks of waiting samples
// under the token budget) → one packed forward → store routed experts beside the KV → sample, check
// stops, fork GRPO siblings → report events and free finished samples' blocks.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>

#include "miles/check.h"
#include "miles/kernels.h"
#include "miles/thread_pool.h"
#include "rollout/engine_impl.h"
#include "rollout/logit_adjust.h"

namespace miles {

using rollout::Sample;
using rollout::SampleState;

namespace {

// The requested tokens' logprobs at one position (GenerateRequest::token_ids_logprob).
std::vector<TopLogprob> requested_logprobs(std::span<const float> row, const SamplingParams& params,
                                           const std::vector<int32_t>& ids) {
  std::vector<TopLogprob> out;
  if (ids.empty()) return out;
  const std::vector<float> values = token_logprobs(row, params, ids);
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) out.push_back({ids[i], values[i]});
  return out;
}

}  // namespace

bool Engine::step() {
  Impl& m = *impl_;
  m.last.items.clear();
  if (m.paused || m.updating) return false;
  // The iteration's time (forward, sampling, bookkeeping; the drafter's apart) by its token count:
  // the cost the adaptive speculation policy weighs drafts against.
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Impl::Item> items = m.schedule();
  if (items.empty()) return false;
  int64_t tokens = 0;
  for (const auto& it : items) tokens += it.n;
  for (const auto& it : items)
    m.last.items.push_back(
        {it.sample->request_id, it.sample->index, it.start, it.n, it.prefill, it.draft});
  m.run_batch(items);
  m.report_and_reap();
  // Without the drafter's time: the cost model is the iteration's (drafting_pays weighs drafting).
  m.iteration_cost.observe(
      tokens, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
                  m.draft_seconds);
  m.draft_seconds = 0;
  ++m.counters.iterations;
  return true;
}

bool Engine::Impl::ensure_blocks(Sample& s, int64_t positions) {
  const int64_t need = kv->blocks_needed(s.slot, positions);
  if (need > pool->free_blocks()) radix->evict(need - pool->free_blocks());
  if (need > pool->free_blocks()) return false;
  MILES_CHECK(kv->reserve(s.slot, positions).ok());
  return true;
}

void Engine::Impl::match_prefix(Sample& s) {
  s.matched_prefix = true;
  s.kv_epoch = weights_epoch;
  if (!opt.enable_prefix_cache) return;
  // Keep at least the last token to compute: its logits start the generation. Input logprobs need
  // the logits of every position from logprob_start_len on: those are computed, not reused.
  int64_t max_blocks = (static_cast<int64_t>(s.tokens.size()) - 1) / opt.block_tokens;
  const rollout::Request& r = *requests.at(s.request_id);
  if (s.index == 0 && r.wants_input_logprobs())
    max_blocks = std::min(max_blocks, r.req.logprob_start_len / opt.block_tokens);
  const std::vector<int32_t> hit = radix->match(s.tokens, max_blocks);
  if (hit.empty()) return;
  kv->adopt(s.slot, hit);
  s.computed = static_cast<int64_t>(hit.size()) * opt.block_tokens;
  s.cached_tokens = std::min(s.computed, s.prompt_len);
}

std::vector<Engine::Impl::Item> Engine::Impl::schedule() {
  std::vector<Item> items;
  int64_t budget = opt.max_batch_tokens;
  // Decodes: every running sample feeds its newest token.
  std::vector<Sample*> decodes = running;
  for (Sample* s : decodes) {
    if (budget <= 0) break;
    if (!ensure_blocks(*s, s->computed + 1)) {
      retract(*s);  // out of memory: recompute it later
      continue;
    }
    items.push_back({s, s->computed, 1, false});
    --budget;
  }
  // Prefills, chunked to the budget, requests with the fewest samples running first (first come
  // first served among equals), so a large group cannot hold a new request back: a request none
  // of whose samples runs yet may start even when max_running samples run, within a reserve of
  // max_running / 8 (docs/api.md, "Scheduling"). A sample whose prompt shares at least one whole
  // block with a prefill in flight (scheduled now or earlier, not finished) waits for it: once
  // that prefill lands in the prefix cache this one reuses its blocks instead of computing them
  // again (n separate GRPO requests sent at once). Outputs never depend on these choices.
  int64_t active = static_cast<int64_t>(running.size());
  std::vector<const Sample*> in_flight;
  for (const Sample* s : waiting)
    if (s->matched_prefix && s->computed > 0) in_flight.push_back(s);
  std::map<uint64_t, int64_t> started;  // per request: samples running or admitted now
  for (const Sample* s : running) ++started[s->request_id];
  std::vector<Sample*> order(waiting.begin(), waiting.end());
  std::stable_sort(order.begin(), order.end(), [&](const Sample* a, const Sample* b) {
    return started[a->request_id] < started[b->request_id];
  });
  const int64_t reserve = opt.max_running / 8;
  for (Sample* s : order) {
    const bool fresh = started[s->request_id] == 0;
    if (budget <= 0 || active >= opt.max_running + (fresh ? reserve : 0)) break;
    if (!s->matched_prefix && waits_for_prefix(*s, in_flight)) continue;
    if (!s->matched_prefix) match_prefix(*s);
    const int64_t chunk = std::min<int64_t>(s->tokens.size() - s->computed, budget);
    if (!ensure_blocks(*s, s->computed + chunk)) break;
    items.push_back({s, s->computed, chunk, true});
    in_flight.push_back(s);
    budget -= chunk;
    ++active;
    ++started[s->request_id];
  }
  plan_drafts(items, budget);
  return items;
}

bool Engine::Impl::waits_for_prefix(const Sample& s,
                                    const std::vector<const Sample*>& in_flight) const {
  if (!opt.enable_prefix_cache) return false;
  const int64_t bt = opt.block_tokens;
  if (static_cast<int64_t>(s.tokens.size()) <= bt) return false;  // no whole block to reuse
  for (const Sample* l : in_flight) {
    if (l == &s || static_cast<int64_t>(l->tokens.size()) < bt || l->kv_epoch != weights_epoch)
      continue;
    if (std::equal(s.tokens.begin(), s.tokens.begin() + bt, l->tokens.begin())) return true;
  }
  return false;
}

void Engine::Impl::run_batch(const std::vector<Item>& items) {
  std::vector<int32_t> tokens;
  std::vector<SeqSpan> seqs;
  std::vector<int64_t> logit_rows;  // per item: its verify rows (1 + draft)
  bool input_rows = false, drafts = false;
  for (const Item& it : items) {
    const auto from = it.sample->tokens.begin() + it.start;
    tokens.insert(tokens.end(), from, from + (it.n - it.draft));
    tokens.insert(tokens.end(), it.sample->draft.begin(), it.sample->draft.begin() + it.draft);
    seqs.push_back({it.sample->slot, it.start, it.n});
    logit_rows.push_back(1 + it.draft);
    input_rows = input_rows || needs_input_rows(it);
    drafts = drafts || it.draft > 0;
  }
  ForwardOptions fo;
  // Every row's logits only when a prompt's input logprobs are asked for, else each item's last
  // (its verify rows when it has drafts); the kernels give each row the same bits either way.
  fo.all_logits = input_rows;
  if (drafts && !input_rows) fo.last_rows = logit_rows;
  fo.return_experts = experts_per_pos > 0;
  const bool want_hidden = drafter && opt.speculative.enabled && drafter->wants_hidden();
  const std::vector<int64_t> taps = want_hidden ? drafter->hidden_layers() : std::vector<int64_t>{};
  fo.tap_layers = taps;
  auto out = runner->forward(tokens, seqs, *kv, fo);
  if (!out.ok()) spdlog::error("miles engine: forward failed: {}", out.message());
  MILES_CHECK(out.ok(), "engine forward failed on a validated batch");
  const int64_t v = out->vocab;
  // Per item, the row predicting the token after its newest (its first verify row).
  std::vector<const float*> first_rows(items.size());
  for (int64_t i = 0, offset = 0, row = 0; i < static_cast<int64_t>(items.size()); ++i) {
    const Item& it = items[i];
    first_rows[i] = out->logits.data() + (input_rows ? offset + it.n - 1 - it.draft : row) * v;
    offset += it.n;
    row += drafts ? 1 + it.draft : 1;
  }
  presample(items, first_rows);
  const int64_t d = runner->config().hidden_size * static_cast<int64_t>(taps.size());
  const bool hidden = !taps.empty() && static_cast<int64_t>(out->taps.size()) ==
                                           static_cast<int64_t>(tokens.size()) * d;
  if (want_hidden && !hidden && !warned_no_hidden) {
    spdlog::error(
        "miles engine: this engine's forwards do not return hidden states; the draft "
        "head drafts nothing");
    warned_no_hidden = true;
  }
  // The target's states of the item's positions whose ids are now fixed, for a model drafter.
  auto hand_hidden = [&](const Sample& s, int64_t start, int64_t row, int64_t n) {
    if (hidden && n > 0 && s.state != SampleState::kFinished)
      drafter->hidden(static_cast<uint64_t>(s.slot), start,
                      std::span<const float>(out->taps).subspan(row * d, n * d));
  };
  int64_t row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    Sample& s = *it.sample;
    if (it.draft > 0) {
      const int64_t valid = verify(it, first_rows[i], v);
      store_experts(s, it.start, valid, out->experts.data() + row * experts_per_pos);
      hand_hidden(s, it.start, row, valid);
      row += it.n;
      continue;
    }
    hand_hidden(s, it.start, row, it.n);
    store_experts(s, it.start, it.n, out->experts.data() + row * experts_per_pos);
    if (input_rows && needs_input_rows(it))
      record_input_logprobs(it, out->logits.data() + row * v, v);
    row += it.n;
    s.computed += it.n;
    if (it.prefill) counters.prompt_tokens += it.n;
    if (s.computed < static_cast<int64_t>(s.tokens.size())) continue;  // more prefill to come
    if (it.prefill) {
      complete_prefill(s, first_rows[i]);
    } else {
      sample_next(s, first_rows[i]);
    }
  }
}

void Engine::Impl::store_experts(const Sample& s, int64_t start, int64_t n, const int32_t* ids) {
  if (experts_per_pos == 0) return;
  const std::vector<int32_t>& table = kv->table(s.slot);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t pos = start + j;
    std::memcpy(
        pool->experts(table[pos / opt.block_tokens]) + (pos % opt.block_tokens) * experts_per_pos,
        ids + j * experts_per_pos, sizeof(int32_t) * experts_per_pos);
  }
}

bool Engine::Impl::needs_input_rows(const Item& it) const {
  const Sample& s = *it.sample;
  if (!it.prefill || s.index != 0) return false;
  const rollout::Request& r = *requests.at(s.request_id);
  if (!r.wants_input_logprobs()) return false;
  // Position p's logits give token p + 1's logprob; the entry at logprob_start_len has none (as in
  // SGLang): positions [start_len, prompt_len - 2].
  const int64_t first = r.req.logprob_start_len;
  const int64_t last = s.prompt_len - 2;
  return it.start <= last && it.start + it.n > first;
}

void Engine::Impl::record_input_logprobs(const Item& it, const float* rows, int64_t vocab) {
  const Sample& s = *it.sample;
  rollout::Request& r = *requests.at(s.request_id);
  const int64_t start_len = r.req.logprob_start_len;
  SamplingParams raw;  // input logprobs are the raw model's: temperature 1, no filters
  for (int64_t j = 0; j < it.n; ++j) {
    const int64_t k = it.start + j + 1;  // the token this row predicts
    if (k <= start_len || k >= s.prompt_len) continue;
    const std::span<const float> row(rows + j * vocab, static_cast<size_t>(vocab));
    InputLogprob& e = r.input_logprobs[static_cast<size_t>(k - start_len)];
    e.logprob = tempered_logprob(row, raw, s.tokens[k]);
    e.top.clear();
    if (r.req.top_logprobs > 0)
      for (const TokenLogprob& x : top_logprobs(row, raw, r.req.top_logprobs))
        e.top.push_back({x.token, x.logprob});
    e.ids = requested_logprobs(row, raw, r.req.token_ids_logprob);
  }
}

void Engine::Impl::presample(const std::vector<Item>& items,
                             const std::vector<const float*>& rows) {
  presampled.clear();
  struct Work {
    const Sample* s;
    const float* row;
    int64_t ahead;
  };
  std::vector<Work> work;
  const int64_t vocab = runner->config().vocab_size;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    const Sample& s = *it.sample;
    if (s.computed + it.n - it.draft < static_cast<int64_t>(s.tokens.size())) continue;  // prefill
    if (static_cast<int64_t>(s.output.size()) >= requests.at(s.request_id)->req.max_new_tokens)
      continue;
    for (int64_t j = 0; j <= it.draft; ++j) work.push_back({&s, rows[i] + j * vocab, j});
  }
  std::vector<TokenOutput> got(work.size());
  parallel_for(work.size() >= 2 ? runner->thread_pool() : nullptr,
               static_cast<int64_t>(work.size()),
               [&](int64_t k) { got[k] = draw(*work[k].s, work[k].row, work[k].ahead); });
  for (size_t k = 0; k < work.size(); ++k) presampled[work[k].s].push_back(std::move(got[k]));
}

TokenOutput Engine::Impl::draw(const Sample& s, const float* logits, int64_t ahead) const {
  const GenerateRequest& req = requests.at(s.request_id)->req;
  const size_t vocab = static_cast<size_t>(runner->config().vocab_size);
  const size_t step = s.output.size() + static_cast<size_t>(ahead);
  std::span<const float> row(logits, vocab);
  std::vector<float> adjusted;
  if (req.adjust.any()) {
    std::vector<int32_t> stops = req.stop_token_ids;  // SGLang masks EOS even with ignore_eos
    if (tok && tok->eos_id() >= 0) stops.push_back(tok->eos_id());
    std::vector<int32_t> record;  // the sample's ids as they will be if its drafts are accepted
    if (ahead > 0) {
      record = s.tokens;
      record.insert(record.end(), s.draft.begin(), s.draft.begin() + ahead);
    }
    adjusted = rollout::adjust_logits(row, req.adjust, ahead > 0 ? record : s.tokens, step, stops);
    row = adjusted;
  }
  const SampleResult r = sample_token(row, s.sampling, static_cast<uint64_t>(step));
  TokenOutput t{r.token, r.logprob, r.raw_logprob, version, r.tempered_logprob, {}};
  if (!adjusted.empty())  // the raw model's logprob, never the adjusted row's
    t.raw_logprob = kernels::log_softmax_at(logits, static_cast<int64_t>(vocab), r.token);
  if (req.top_logprobs > 0)
    for (const TokenLogprob& x : top_logprobs(row, s.sampling, req.top_logprobs))
      t.top.push_back({x.token, x.logprob});
  t.ids = requested_logprobs(row, s.sampling, req.token_ids_logprob);
  return t;
}

void Engine::Impl::complete_prefill(Sample& s, const float* logits) {
  waiting.erase(std::find(waiting.begin(), waiting.end(), &s));
  running.push_back(&s);
  s.state = SampleState::kRunning;
  counters.cached_prompt_tokens += s.cached_tokens;
  if (opt.enable_prefix_cache && s.kv_epoch == weights_epoch)
    radix->insert(s.tokens, kv->table(s.slot));
  rollout::Request& r = *requests.at(s.request_id);
  if (s.index == 0) r.input_logprobs_done = true;
  sample_next(s, logits);
  if (s.index != 0 || s.output.size() > 1) return;
  // Siblings start decoding at once while max_running allows; the rest wait as ordinary prefills
  // (their prompt's whole blocks come from the prefix cache), so a large n does not exceed it.
  for (auto& sib : r.samples) {
    if (sib->state != SampleState::kForkWaiting) continue;
    if (static_cast<int64_t>(running.size()) < opt.max_running) {
      fork_sibling(s, *sib, logits);
    } else {
      sib->state = SampleState::kWaiting;
      waiting.push_back(sib.get());
    }
  }
}

// A GRPO sibling starts from the leader's prefill: whole blocks shared, the partial last block
// copied, and its first token drawn from the same logits with its own seed.
void Engine::Impl::fork_sibling(Sample& leader, Sample& sib, const float* logits) {
  const int64_t bt = opt.block_tokens;
  const int64_t prompt = sib.prompt_len;
  const std::vector<int32_t>& lt = kv->table(leader.slot);
  const int64_t full = prompt / bt, tail = prompt % bt;
  sib.matched_prefix = true;
  sib.kv_epoch = leader.kv_epoch;
  if (tail != 0 && pool->free_blocks() == 0) radix->evict(1);
  if (tail != 0 && pool->free_blocks() == 0) {
    sib.state = SampleState::kWaiting;  // no room to copy: prefill it (prefix hits) later
    waiting.push_back(&sib);
    sib.matched_prefix = false;
    return;
  }
  kv->adopt(sib.slot, std::vector<int32_t>(lt.begin(), lt.begin() + full));
  if (tail != 0) {
    MILES_CHECK(kv->reserve(sib.slot, prompt).ok());
    pool->copy_prefix(lt[full], kv->table(sib.slot)[full], tail);
    runner->copied_kv_prefix(lt[full], kv->table(sib.slot)[full], tail);
  }
  if (drafter) drafter->fork(static_cast<uint64_t>(leader.slot), static_cast<uint64_t>(sib.slot));
  sib.computed = prompt;
  sib.cached_tokens = prompt;
  sib.state = SampleState::kRunning;
  running.push_back(&sib);
  counters.cached_prompt_tokens += prompt;
  sample_next(sib, logits);
}

void Engine::Impl::sample_next(Sample& s, const float* logits) {
  const GenerateRequest& req = requests.at(s.request_id)->req;
  const int64_t context = runner->config().max_position_embeddings;
  if (static_cast<int64_t>(s.output.size()) >= req.max_new_tokens) {
    finish(s, FinishReason::kLength, "");
    return;
  }
  // Drawn across threads before the batch's sequential bookkeeping when possible (presample); the
  // same pure function either way.
  auto pre = presampled.find(&s);
  TokenOutput t;
  if (pre != presampled.end() && !pre->second.empty()) {
    t = std::move(pre->second.front());
    pre->second.pop_front();
  } else {
    t = draw(s, logits);
  }
  const int32_t token = t.id;
  s.tokens.push_back(token);
  s.output.push_back(t);
  s.pending.push_back(std::move(t));
  ++counters.generated_tokens;
  const bool is_eos = tok && !req.ignore_eos && token == tok->eos_id();
  if (is_eos || std::count(req.stop_token_ids.begin(), req.stop_token_ids.end(), token)) {
    finish(s, FinishReason::kStop, std::to_string(token));
    return;
  }
  if (!req.stop_strings.empty()) {
    std::vector<int32_t> ids;
    for (const auto& o : s.output) ids.push_back(o.id);
    s.text = tok->decode(ids);
    for (const auto& stop : req.stop_strings)
      if (s.text.find(stop) != std::string::npos) {
        finish(s, FinishReason::kStop, stop);
        return;
      }
  }
  if (static_cast<int64_t>(s.output.size()) >= req.max_new_tokens ||
      static_cast<int64_t>(s.tokens.size()) >= context)
    finish(s, FinishReason::kLength, "");
}

void Engine::Impl::finish(Sample& s, FinishReason why, std::string matched) {
  if (drafter && why != FinishReason::kAbort)
    drafter->observe(std::span(s.tokens).first(static_cast<size_t>(s.prompt_len)),
                     std::span(s.tokens).subspan(static_cast<size_t>(s.prompt_len)));
  if (drafter) drafter->forget(static_cast<uint64_t>(s.slot));
  s.finish = why;
  s.matched_stop = std::move(matched);
  s.state = SampleState::kFinished;
  running.erase(std::remove(running.begin(), running.end(), &s), running.end());
  waiting.erase(std::remove(waiting.begin(), waiting.end(), &s), waiting.end());
}

void Engine::Impl::release(Sample& s) {
  if (!kv->has(s.slot)) return;
  if (opt.enable_prefix_cache && s.finish != FinishReason::kAbort && s.kv_epoch == weights_epoch) {
    const std::vector<int32_t>& t = kv->table(s.slot);
    radix->insert(std::span(s.tokens).first(std::min<size_t>(s.computed, s.tokens.size())), t);
  }
  kv->release(s.slot);
}

// Frees the sample's blocks (keeping whole ones in the prefix cache) and queues it to recompute its
// prompt + output so far; its outputs and their versions stay as they were.
void Engine::Impl::retract(Sample& s) {
  ++counters.retractions;
  if (drafter) drafter->forget(static_cast<uint64_t>(s.slot));
  release(s);
  s.computed = 0;
  s.matched_prefix = false;
  running.erase(std::remove(running.begin(), running.end(), &s), running.end());
  if (std::find(waiting.begin(), waiting.end(), &s) == waiting.end()) waiting.push_front(&s);
  s.state = SampleState::kWaiting;
}

std::vector<int32_t> Engine::Impl::routed_experts(const Sample& s) const {
  std::vector<int32_t> out;
  if (experts_per_pos == 0 || !kv->has(s.slot)) return out;
  const std::vector<int32_t>& table = kv->table(s.slot);
  const int64_t n = std::min<int64_t>(s.computed, static_cast<int64_t>(s.tokens.size()) - 1);
  for (int64_t pos = 0; pos < n; ++pos) {
    const int32_t* e =
        pool->experts(table[pos / opt.block_tokens]) + (pos % opt.block_tokens) * experts_per_pos;
    out.insert(out.end(), e, e + experts_per_pos);
  }
  return out;
}

void Engine::Impl::report_and_reap() {
  std::vector<uint64_t> done;
  for (auto& [id, r] : requests) {
    bool all_finished = true;
    for (auto& sp : r->samples) {
      Sample& s = *sp;
      const bool just_finished = s.state == SampleState::kFinished && kv->has(s.slot);
      if (!s.pending.empty() || just_finished ||
          (s.state == SampleState::kFinished && s.finish != FinishReason::kNone)) {
        SampleEvent ev;
        ev.request_id = id;
        ev.sample_index = s.index;
        ev.new_tokens = std::move(s.pending);
        s.pending.clear();
        if (s.state == SampleState::kFinished) {
          ev.finished = true;
          ev.finish_reason = s.finish;
          ev.matched_stop = s.matched_stop;
          ev.prompt_tokens = s.prompt_len;
          ev.cached_tokens = s.cached_tokens;
          ev.seed = s.sampling.seed;
          ev.output = s.output;
          ev.input_logprobs = r->input_logprobs;
          ev.routed_experts = routed_experts(s);
          release(s);
          s.finish = FinishReason::kNone;  // reported once
          s.matched_stop.clear();
        }
        if (r->listener) r->listener(ev);
      }
      if (s.state != SampleState::kFinished) all_finished = false;
    }
    if (all_finished) done.push_back(id);
  }
  for (uint64_t id : done) {
    for (auto& sp : requests[id]->samples) {
      waiting.erase(std::remove(waiting.begin(), waiting.end(), sp.get()), waiting.end());
      running.erase(std::remove(running.begin(), running.end(), sp.get()), running.end());
    }
    requests.erase(id);
  }
}

}  // namespace miles
