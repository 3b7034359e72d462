// Limits on one render of a template: steps of work, bytes built, the size of one value, and how
// deeply values nest.
//
// Why: a chat template is code that comes with a model or a request, and jinja2's sandbox bounds
// only range(). Without these, a `{% for %}` inside a `{% for %}`, a long string printed in a loop,
// a list doubled on every iteration, `center(10**12)` or a namespace that holds itself would hang a
// worker, exhaust its memory or overflow its stack. Each limit is far above what real chat
// templates need (Qwen3's renders a six-message tool-calling conversation in under 600 steps and
// 10 KB; a loop over jinja2's MAX_RANGE of 100000 still fits) and fails with a TemplateError that
// names it, which Template::render turns into a Status. At the step limit a render stops within
// about 4 s under ASan (tests/fuzz/fuzz_jinja.cc times out at 10 s), well under 1 s otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja_value.h"

namespace miles::jinja {

inline constexpr uint64_t kMaxRenderSteps = 1'000'000;  // statements, expressions, values visited
inline constexpr uint64_t kMaxRenderBytes = uint64_t{256} << 20;  // strings and lists built, in all
inline constexpr uint64_t kMaxValueBytes = uint64_t{64} << 20;    // one string or list, the output
inline constexpr int kMaxNesting = 500;  // lists, dicts and namespaces within one another

// The work of the renders on this thread while it lives (Template::render makes one per render).
class RenderBudget {
 public:
  RenderBudget();
  ~RenderBudget();
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

  uint64_t steps = 0;
  uint64_t bytes = 0;

 private:
  RenderBudget* outer_;
};

// Counts `n` steps against the thread's render (nothing outside one); fails past kMaxRenderSteps.
void spend_steps(uint64_t n = 1);
// Counts a value of `n` bytes about to be built (or just built): fails when one value is larger
// than kMaxValueBytes or the render has built more than kMaxRenderBytes. Nothing outside a render.
void spend_bytes(uint64_t n);
// out += piece, counted as spend_bytes(piece.size()), and out may not outgrow kMaxValueBytes.
void append_bounded(std::string& out, std::string_view piece);
// What copying `items` builds: a Value each, and the bytes of the strings (containers are shared).
uint64_t copy_bytes(const std::vector<Value>& items);

// One level of a function that walks nested values (repr, tojson, ==, <, JSON conversion): fails
// past kMaxNesting levels, a cycle through a namespace included. Counts on any thread, in or out
// of a render.
class NestingGuard {
 public:
  NestingGuard();
  ~NestingGuard();
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;
};

}  // namespace miles::jinja
