// The render budget and nesting guard of jinja_limits.h: thread-local counters, so that the free
// functions that build and walk values (printers, comparisons, filters) need no Interp to count.
#include "chat/jinja_limits.h"

namespace miles::jinja {
namespace {

thread_local RenderBudget* current_budget = nullptr;
thread_local int nesting = 0;

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

RenderBudget::RenderBudget() : outer_(current_budget) { current_budget = this; }

RenderBudget::~RenderBudget() { current_budget = outer_; }

void spend_steps(uint64_t n) {
  RenderBudget* b = current_budget;
  if (!b) return;
  b->steps += n;
  if (b->steps > kMaxRenderSteps)
    fail("the template runs more than " + std::to_string(kMaxRenderSteps) +
         " steps (a loop or recursion without end?)");
}

void spend_bytes(uint64_t n) {
  RenderBudget* b = current_budget;
  if (!b) return;
  if (n > kMaxValueBytes)
    fail("a string or list of " + std::to_string(n) +
         " bytes is too large (templates build values of up to " + mib(kMaxValueBytes) + ")");
  b->bytes += n;
  if (b->bytes > kMaxRenderBytes)
    fail("the template builds more than " + mib(kMaxRenderBytes) +
         " of strings and lists (a loop that grows its output without end?)");
}

void append_bounded(std::string& out, std::string_view piece) {
  spend_bytes(piece.size());
  if (current_budget && out.size() + piece.size() > kMaxValueBytes)
    fail("a string of more than " + mib(kMaxValueBytes) +
         " is too large (templates build values of up to " + mib(kMaxValueBytes) + ")");
  out += piece;
}

uint64_t copy_bytes(const std::vector<Value>& items) {
  uint64_t n = items.size() * sizeof(Value);
  for (const Value& v : items)
    if (v.is_string()) n += v.as_string().size();
  return n;
}

NestingGuard::NestingGuard() {
  if (++nesting > kMaxNesting) {
    --nesting;
    fail("a value nests more than " + std::to_string(kMaxNesting) +
         " levels deep (a namespace that holds itself?)");
  }
}

NestingGuard::~NestingGuard() { --nesting; }

}  // namespace miles::jinja
