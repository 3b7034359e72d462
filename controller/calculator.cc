// The calculator tool (calculator.h): a recursive-descent evaluator and the call finder.
#include "controller/calculator.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <vector>

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
    // The whole run must be the number ("1.2.3" is not 1.2); from_chars, unlike stod, says so.
    const auto [end, ec] = std::from_chars(s.data() + start, s.data() + i, v);
    if (ec != std::errc() || end != s.data() + i) {
      const std::string run = s.substr(start, i - start);
      i = start;
      return fail("bad number '" + run + "'");
    }
    return true;
  }
};

bool is_digit(char c) { return c >= '0' && c <= '9'; }
// std::regex's \s in the C locale.
bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// The expression of the first "calculator(" whose parentheses close with at most one level nested
// inside: calculator\(([^()]*(?:\([^()]*\)[^()]*)*)\) as an ECMAScript search would take it. By
// the parentheses alone, from the back: closes[j] is where "()"* ")" starting at the j-th
// parenthesis ends (npos: it does not), so each candidate is looked up, not scanned again.
std::optional<std::string> find_call_syntax(std::string_view text) {
  constexpr std::string_view kName = "calculator(";
  std::vector<size_t> parens;
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] == '(' || text[i] == ')') parens.push_back(i);
  constexpr size_t npos = std::string_view::npos;
  std::vector<size_t> closes(parens.size() + 2, npos);
  for (size_t j = parens.size(); j-- > 0;) {
    if (text[parens[j]] == ')')
      closes[j] = parens[j];
    else if (j + 1 < parens.size() && text[parens[j + 1]] == ')')
      closes[j] = closes[j + 2];
  }
  for (size_t at = text.find(kName); at != npos; at = text.find(kName, at + 1)) {
    const size_t open = at + kName.size() - 1;
    const size_t j = std::lower_bound(parens.begin(), parens.end(), open) - parens.begin();
    if (const size_t close = closes[j + 1]; close != npos)
      return std::string(text.substr(open + 1, close - open - 1));
  }
  return std::nullopt;
}

// One number of an equation from `i`: \(?-?\d+(?:\.\d+)? (opening: the '(' it may start with),
// then \)? after an operand. The end, or npos when none starts at i; *fraction: where its digits
// after the '.' start (npos: none).
size_t number_end(std::string_view t, size_t i, bool operand, size_t* fraction) {
  *fraction = std::string_view::npos;
  if (i < t.size() && t[i] == '(') ++i;
  if (i < t.size() && t[i] == '-') ++i;
  if (i >= t.size() || !is_digit(t[i])) return std::string_view::npos;
  while (i < t.size() && is_digit(t[i])) ++i;
  if (i + 1 < t.size() && t[i] == '.' && is_digit(t[i + 1])) {
    *fraction = ++i;
    while (i < t.size() && is_digit(t[i])) ++i;
  }
  if (operand && i < t.size() && t[i] == ')') ++i;
  return i;
}

// The first arithmetic expression directly followed by '=': the group of
// (\(?-?\d+(?:\.\d+)?(?:\s*[-+*/x]\s*\(?-?\d+(?:\.\d+)?\)?)+)\s*= as an ECMAScript search
// would find it, in linear time (the regex's backtracking recursed once per character and
// overflowed an 8 MB stack on a reply of ~30 KB). Each piece of the pattern has one way to match
// at a given place (what a shorter match leaves next can never continue it), so a start is parsed
// greedily. A start that fails at `end` fails from every later start before it (the same pieces
// from there on, ending at the same place), except inside the last number's fraction: "4.54.5-1="
// fails from the 4 but matches "54.5-1" from the 5. The search resumes there, else at `end`.
std::optional<std::string> find_equation(std::string_view t) {
  constexpr size_t npos = std::string_view::npos;
  for (size_t start = 0; start < t.size();) {
    size_t fraction;
    size_t end = number_end(t, start, /*operand=*/false, &fraction);
    if (end == npos) {
      ++start;
      continue;
    }
    int operands = 0;
    for (;;) {
      size_t i = end;
      while (i < t.size() && is_space(t[i])) ++i;
      if (i >= t.size() || std::string_view("-+*/x").find(t[i]) == npos) break;
      for (++i; i < t.size() && is_space(t[i]);) ++i;
      size_t next_fraction;
      const size_t next = number_end(t, i, /*operand=*/true, &next_fraction);
      if (next == npos) break;
      end = next;
      fraction = next_fraction;
      ++operands;
    }
    size_t i = end;
    while (i < t.size() && is_space(t[i])) ++i;
    if (operands > 0 && i < t.size() && t[i] == '=')
      return std::string(t.substr(start, end - start));
    start = fraction != npos ? fraction : std::max(start + 1, end);
  }
  return std::nullopt;
}

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
  if (auto call = find_call_syntax(text)) return call;
  return find_equation(text);
}

std::string calculator_reply(const std::string& expr) {
  auto v = evaluate_arithmetic(expr);
  if (!v.ok()) return expr + ": error: " + v.message();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", *v);
  return expr + " = " + buf;
}

}  // namespace miles::controller
