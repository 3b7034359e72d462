// finish_reason_name: the wire name of a FinishReason (SGLang's "stop", "length", "abort"), in a
// file of its own so that the request parsers link without the engine (tests/fuzz).
#include "miles/rollout/engine.h"

namespace miles {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "?";
}

}  // namespace miles
