// One engine iteration: schedule (running decodes first, then prefill chunks of waiting samples
// under the token budget) → one packed forward → store routed experts beside the KV → sample, check
// stops, fork GRPO siblings → report events and free finished samples' blocks.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "miles/check.h"
#include "miles/thread_pool.h"
#include "rollout/engine_impl.h"

namespace miles {

using rollout::Sample;
using rollout::SampleState;

bool Engine::step() {
  Impl& m = *impl_;
  m.last.items.clear();
  if (m.paused || m.updating) return false;
  const std::vector<Impl::Item> items = m.schedule();
  if (items.empty()) return false;
  for (const auto& it : items)
    m.last.items.push_back({it.sample->request_id, it.sample->index, it.start, it.n, it.prefill});
  m.run_batch(items);
  m.report_and_reap();
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
  // Keep at least the last token to compute: its logits start the generation.
  const int64_t max_blocks = (static_cast<int64_t>(s.tokens.size()) - 1) / opt.block_tokens;
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
  // Prefills, first come first served, chunked to the budget. A sample whose prompt shares at least
  // one whole block with a prefill in flight (scheduled now or earlier, not finished) waits for it:
  // once that prefill lands in the prefix cache this one reuses its blocks instead of computing
  // them again (n separate GRPO requests sent at once). Outputs never depend on this choice.
  int64_t active = static_cast<int64_t>(running.size());
  std::vector<const Sample*> in_flight;
  for (const Sample* s : waiting)
    if (s->matched_prefix && s->computed > 0) in_flight.push_back(s);
  for (Sample* s : waiting) {
    if (budget <= 0 || active >= opt.max_running) break;
    if (!s->matched_prefix && waits_for_prefix(*s, in_flight)) continue;
    if (!s->matched_prefix) match_prefix(*s);
    const int64_t chunk = std::min<int64_t>(s->tokens.size() - s->computed, budget);
    if (!ensure_blocks(*s, s->computed + chunk)) break;
    items.push_back({s, s->computed, chunk, true});
    in_flight.push_back(s);
    budget -= chunk;
    ++active;
  }
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
  for (const Item& it : items) {
    tokens.insert(tokens.end(), it.sample->tokens.begin() + it.start,
                  it.sample->tokens.begin() + it.start + it.n);
    seqs.push_back({it.sample->slot, it.start, it.n});
  }
  ForwardOptions fo;
  fo.all_logits = false;
  fo.return_experts = experts_per_pos > 0;
  auto out = runner->forward(tokens, seqs, *kv, fo);
  if (!out.ok()) std::fprintf(stderr, "miles engine: forward failed: %s\n", out.message().c_str());
  MILES_CHECK(out.ok(), "engine forward failed on a validated batch");
  const int64_t v = out->vocab;
  presample(items, out->logits.data(), v);
  int64_t row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    Sample& s = *it.sample;
    if (experts_per_pos > 0) {
      const std::vector<int32_t>& table = kv->table(s.slot);
      for (int64_t j = 0; j < it.n; ++j) {
        const int64_t pos = it.start + j;
        std::memcpy(pool->experts(table[pos / opt.block_tokens]) +
                        (pos % opt.block_tokens) * experts_per_pos,
                    out->experts.data() + (row + j) * experts_per_pos,
                    sizeof(int32_t) * experts_per_pos);
      }
    }
    row += it.n;
    s.computed += it.n;
    if (it.prefill) counters.prompt_tokens += it.n;
    if (s.computed < static_cast<int64_t>(s.tokens.size())) continue;  // more prefill to come
    const float* logits = out->logits.data() + i * v;
    if (it.prefill) {
      complete_prefill(s, logits);
    } else {
      sample_next(s, logits);
    }
  }
}

void Engine::Impl::presample(const std::vector<Item>& items, const float* logits, int64_t vocab) {
  presampled.clear();
  std::vector<std::pair<const Sample*, const float*>> work;
  for (size_t i = 0; i < items.size(); ++i) {
    const Sample& s = *items[i].sample;
    if (s.computed + items[i].n < static_cast<int64_t>(s.tokens.size())) continue;  // mid-prefill
    if (static_cast<int64_t>(s.output.size()) >= requests.at(s.request_id)->req.max_new_tokens)
      continue;
    work.emplace_back(&s, logits + i * vocab);
  }
  std::vector<SampleResult> got(work.size());
  parallel_for(work.size() >= 2 ? runner->thread_pool() : nullptr,
               static_cast<int64_t>(work.size()), [&](int64_t k) {
                 const Sample& s = *work[k].first;
                 got[k] = sample_token({work[k].second, static_cast<size_t>(vocab)}, s.sampling,
                                       static_cast<uint64_t>(s.output.size()));
               });
  for (size_t k = 0; k < work.size(); ++k) presampled.emplace(work[k].first, got[k]);
}

void Engine::Impl::complete_prefill(Sample& s, const float* logits) {
  waiting.erase(std::find(waiting.begin(), waiting.end(), &s));
  running.push_back(&s);
  s.state = SampleState::kRunning;
  counters.cached_prompt_tokens += s.cached_tokens;
  if (opt.enable_prefix_cache && s.kv_epoch == weights_epoch)
    radix->insert(s.tokens, kv->table(s.slot));
  sample_next(s, logits);
  if (s.index != 0 || s.output.size() > 1) return;
  rollout::Request& r = *requests.at(s.request_id);
  for (auto& sib : r.samples)
    if (sib->state == SampleState::kForkWaiting) fork_sibling(s, *sib, logits);
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
  const SampleResult r =
      pre != presampled.end()
          ? pre->second
          : sample_token({logits, static_cast<size_t>(runner->config().vocab_size)}, s.sampling,
                         static_cast<uint64_t>(s.output.size()));
  if (pre != presampled.end()) presampled.erase(pre);
  const TokenOutput t{r.token, r.logprob, r.raw_logprob, version};
  s.tokens.push_back(r.token);
  s.output.push_back(t);
  s.pending.push_back(t);
  ++counters.generated_tokens;
  const bool is_eos = tok && !req.ignore_eos && r.token == tok->eos_id();
  if (is_eos || std::count(req.stop_token_ids.begin(), req.stop_token_ids.end(), r.token)) {
    finish(s, FinishReason::kStop, std::to_string(r.token));
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
          ev.output = s.output;
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
