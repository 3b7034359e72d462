// The calculator tool (calculator.h): a recursive-descent evaluator and the call finder.
#include "controller/calculator.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <regex>

namespace miles::controller {

namespace {

struct Parser {
  const std::string& s;
  size_t i = 0;
  std::string error;
  void skip() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool fail(const std::string& why) {
    if (error.empty()) error = why + " at position " + std::to_string(i);
    return false;
  }
  bool expr(double& v, int depth) {
    if (depth > 64) return fail("nesting too deep");
    if (!term(v, depth)) return false;
    for (skip(); i < s.size() && (s[i] == '+' || s[i] == '-'); skip()) {
      const char op = s[i++];
      double r;
      if (!term(r, depth)) return false;
      v = op == '+' ? v + r : v - r;
    }
    return true;
  }
  bool term(double& v, int depth) {
    if (!factor(v, depth)) return false;
    for (skip(); i < s.size() && (s[i] == '*' || s[i] == '/' || s[i] == 'x'); skip()) {
      const char op = s[i++];
      double r;
      if (!factor(r, depth)) return false;
      if (op == '/' && r == 0) return fail("division by zero");
      v = op == '/' ? v / r : v * r;
    }
    return true;
  }
  bool factor(double& v, int depth) {
    skip();
    if (i < s.size() && s[i] == '-') {
      ++i;
      if (!factor(v, depth + 1)) return false;
      v = -v;
      return true;
    }
    if (i < s.size() && s[i] == '(') {
      ++i;
      if (!expr(v, depth + 1)) return false;
      skip();
      if (i >= s.size() || s[i] != ')') return fail("missing ')'");
      ++i;
      return true;
    }
    const size_t start = i;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
    if (start == i) return fail("expected a number");
    try {
      v = std::stod(s.substr(start, i - start));
    } catch (...) {
      return fail("bad number");
    }
    return true;
  }
};

}  // namespace

Result<double> evaluate_arithmetic(const std::string& expr) {
  Parser p{expr, 0, {}};
  double v = 0;
  if (!p.expr(v, 0)) return Status::Error(p.error);
  p.skip();
  if (p.i != expr.size())
    return Status::Error("unexpected '" + expr.substr(p.i, 1) + "' at position " +
                         std::to_string(p.i));
  if (!std::isfinite(v)) return Status::Error("the result is not finite");
  return v;
}

std::optional<std::string> find_calculator_call(const std::string& text) {
  static const std::regex kCall(R"(calculator\(([^()]*(?:\([^()]*\)[^()]*)*)\))");
  static const std::regex kEquation(
      R"((\(?-?\d+(?:\.\d+)?(?:\s*[-+*/x]\s*\(?-?\d+(?:\.\d+)?\)?)+)\s*=)");
  std::smatch m;
  if (std::regex_search(text, m, kCall)) return m[1].str();
  if (std::regex_search(text, m, kEquation)) return m[1].str();
  return std::nullopt;
}

std::string calculator_reply(const std::string& expr) {
  auto v = evaluate_arithmetic(expr);
  if (!v.ok()) return expr + ": error: " + v.message();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", *v);
  return expr + " = " + buf;
}

}  // namespace miles::controller
