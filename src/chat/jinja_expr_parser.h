// Jinja expression parser and token stream: the half of jinja2/parser.py that parses expressions.
//
// Why: Jinja's operator precedence differs from Python's in places (`~` binds tighter than `+`, a
// filter binds to the unary expression before it, `not x is y` is `not (x is y)`), and a template
// only renders the same if it parses the same; these functions are a function-for-function port of
// jinja2's parse_expression .. parse_primary. The statement parser (jinja_parser.cc) derives from
// it.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"

namespace miles::jinja {

// "end of print statement", "name", ... for error messages.
const char* describe(TokType t);

class ExprParser {
 public:
  explicit ExprParser(const std::vector<Token>& toks) : t_(toks) {}

 protected:
  // ---- token stream ----
  const Token& cur() const { return t_[p_]; }
  const Token& look() const { return t_[p_ + 1 < t_.size() ? p_ + 1 : p_]; }
  const Token& next() {
    const Token& tok = t_[p_];
    if (p_ + 1 < t_.size()) ++p_;
    return tok;
  }
  bool is_op(std::string_view op) const { return cur().type == TokType::kOp && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().type == TokType::kName && cur().text == n; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail_here(const std::string& msg) const { fail(msg, cur().line); }
  std::string cur_desc() const {
    if (cur().type == TokType::kName || cur().type == TokType::kOp) return "'" + cur().text + "'";
    return describe(cur().type);
  }
  const Token& expect_op(std::string_view op) {
    if (!is_op(op)) fail_here("expected '" + std::string(op) + "', got " + cur_desc());
    return next();
  }
  const Token& expect_name() {
    if (cur().type != TokType::kName) fail_here("expected a name, got " + cur_desc());
    return next();
  }
  void expect_name(std::string_view n) {
    if (!skip_name(n)) fail_here("expected '" + std::string(n) + "', got " + cur_desc());
  }
  void expect_block_end() {
    if (cur().type != TokType::kBlockEnd)
      fail_here("expected end of statement block ('%}'), got " + cur_desc());
    next();
  }

  static constexpr int kMaxDepth = 200;  // nesting of expressions and blocks (a stack guard)
  struct DepthGuard {
    explicit DepthGuard(ExprParser& p) : p(p) {
      if (++p.depth_ > kMaxDepth) p.fail_here("template nesting is too deep");
    }
    ~DepthGuard() { --p.depth_; }
    ExprParser& p;
  };

  static ExprPtr make(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ---- expressions (jinja2 precedence) ----
  bool is_tuple_end(std::string_view extra_end) const;
  // parse_tuple: `a, b, c` (a kTuple) or a single expression; simplified parses only primaries;
  // extra_end is a name that also ends the tuple ("in" in for loops).
  ExprPtr parse_tuple(bool simplified, bool with_condexpr, std::string_view extra_end,
                      bool explicit_parens);
  ExprPtr parse_expression(bool with_condexpr);
  ExprPtr parse_condexpr();
  ExprPtr binary(ExprKind k, ExprPtr l, ExprPtr r, int line, std::string op = {});
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_list();
  ExprPtr parse_dict();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  void parse_call_args(Expr& e);
  ExprPtr parse_call(ExprPtr node);
  ExprPtr parse_filter_call(ExprPtr node);
  ExprPtr parse_test(ExprPtr node);

  const std::vector<Token>& t_;
  size_t p_ = 0;
  int depth_ = 0;
};

}  // namespace miles::jinja
