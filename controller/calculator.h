// The calculator tool of the agentic environment (rollout.environment: calculator).
//
// Why: a tool whose result the model cannot produce by itself makes a multi-turn trajectory: the
// model's turn, an environment turn (loss mask 0), the model's next turn. Tool calls are parsed
// from the model's text: `calculator(EXPR)`, or — for models never taught a tool format — an
// arithmetic expression followed by '=' ("17*23 ="), which the tool then completes.
#pragma once

#include <optional>
#include <string>

#include "miles/status.h"

namespace miles::controller {

// The first tool call in `text`: the expression inside calculator(...), else the first
// arithmetic expression (at least one operator) directly followed by '='.
std::optional<std::string> find_calculator_call(const std::string& text);
// + − * / and parentheses over decimal numbers; errors name the position.
Result<double> evaluate_arithmetic(const std::string& expr);
// The tool message's content for a call: "17*23 = 391", or "17/0: error: division by zero".
std::string calculator_reply(const std::string& expr);

}  // namespace miles::controller
