// Jinja expression parser (see jinja_expr_parser.h). Function names follow jinja2/parser.py.
#include "chat/jinja_expr_parser.h"

#include <string>
#include <utility>

namespace miles::jinja {

const char* describe(TokType t) {
  switch (t) {
    case TokType::kData:
      return "template data";
    case TokType::kVarBegin:
      return "begin of print statement";
    case TokType::kVarEnd:
      return "end of print statement";
    case TokType::kBlockBegin:
      return "begin of statement block";
    case TokType::kBlockEnd:
      return "end of statement block";
    case TokType::kName:
      return "name";
    case TokType::kString:
      return "string";
    case TokType::kInt:
      return "integer";
    case TokType::kFloat:
      return "float";
    case TokType::kOp:
      return "operator";
    case TokType::kEof:
      return "end of template";
  }
  return "token";
}

bool ExprParser::is_tuple_end(std::string_view extra_end) const {
  const TokType t = cur().type;
  if (t == TokType::kVarEnd || t == TokType::kBlockEnd || t == TokType::kEof) return true;
  if (is_op(")")) return true;
  return !extra_end.empty() && is_name(extra_end);
}

ExprPtr ExprParser::parse_tuple(bool simplified, bool with_condexpr, std::string_view extra_end,
                                bool explicit_parens) {
  const int line = cur().line;
  std::vector<ExprPtr> args;
  bool is_tuple = false;
  for (;;) {
    if (!args.empty()) expect_op(",");
    if (is_tuple_end(extra_end)) break;
    args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
    if (is_op(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!args.empty()) return std::move(args[0]);
    if (!explicit_parens) fail_here("expected an expression, got " + cur_desc());
  }
  auto e = make(ExprKind::kTuple, line);
  e->args = std::move(args);
  return e;
}

ExprPtr ExprParser::parse_expression(bool with_condexpr) {
  DepthGuard g(*this);
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprPtr ExprParser::parse_condexpr() {
  int line = cur().line;
  ExprPtr expr1 = parse_or();
  while (skip_name("if")) {
    ExprPtr expr2 = parse_or();
    ExprPtr expr3 = skip_name("else") ? parse_condexpr() : nullptr;
    auto e = make(ExprKind::kCond, line);
    e->args.push_back(std::move(expr1));
    e->args.push_back(std::move(expr2));
    e->args.push_back(std::move(expr3));
    expr1 = std::move(e);
    line = cur().line;
  }
  return expr1;
}

ExprPtr ExprParser::binary(ExprKind k, ExprPtr l, ExprPtr r, int line, std::string op) {
  auto e = make(k, line);
  e->name = std::move(op);
  e->args.push_back(std::move(l));
  e->args.push_back(std::move(r));
  return e;
}

ExprPtr ExprParser::parse_or() {
  int line = cur().line;
  ExprPtr left = parse_and();
  while (skip_name("or")) {
    left = binary(ExprKind::kOr, std::move(left), parse_and(), line);
    line = cur().line;
  }
  return left;
}

ExprPtr ExprParser::parse_and() {
  int line = cur().line;
  ExprPtr left = parse_not();
  while (skip_name("and")) {
    left = binary(ExprKind::kAnd, std::move(left), parse_not(), line);
    line = cur().line;
  }
  return left;
}

ExprPtr ExprParser::parse_not() {
  if (is_name("not")) {
    const int line = next().line;
    DepthGuard g(*this);
    auto e = make(ExprKind::kNot, line);
    e->args.push_back(parse_not());
    return e;
  }
  return parse_compare();
}

ExprPtr ExprParser::parse_compare() {
  const int line = cur().line;
  ExprPtr expr = parse_math1();
  std::vector<std::string> ops;
  std::vector<ExprPtr> operands;
  for (;;) {
    if (cur().type == TokType::kOp &&
        (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
         cur().text == ">" || cur().text == ">=")) {
      ops.push_back(next().text);
    } else if (skip_name("in")) {
      ops.push_back("in");
    } else if (is_name("not") && look().type == TokType::kName && look().text == "in") {
      next();
      next();
      ops.push_back("notin");
    } else {
      break;
    }
    operands.push_back(parse_math1());
  }
  if (ops.empty()) return expr;
  auto e = make(ExprKind::kCompare, line);
  e->args.push_back(std::move(expr));
  for (auto& o : operands) e->args.push_back(std::move(o));
  e->ops = std::move(ops);
  return e;
}

ExprPtr ExprParser::parse_math1() {
  int line = cur().line;
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    const std::string op = next().text;
    left = binary(ExprKind::kBinary, std::move(left), parse_concat(), line, op);
    line = cur().line;
  }
  return left;
}

ExprPtr ExprParser::parse_concat() {
  const int line = cur().line;
  ExprPtr first = parse_math2();
  if (!is_op("~")) return first;
  auto e = make(ExprKind::kConcat, line);
  e->args.push_back(std::move(first));
  while (skip_op("~")) e->args.push_back(parse_math2());
  return e;
}

ExprPtr ExprParser::parse_math2() {
  int line = cur().line;
  ExprPtr left = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const std::string op = next().text;
    left = binary(ExprKind::kBinary, std::move(left), parse_pow(), line, op);
    line = cur().line;
  }
  return left;
}

ExprPtr ExprParser::parse_pow() {
  int line = cur().line;
  ExprPtr left = parse_unary(true);
  while (skip_op("**")) {
    left = binary(ExprKind::kBinary, std::move(left), parse_unary(true), line, "**");
    line = cur().line;
  }
  return left;
}

ExprPtr ExprParser::parse_unary(bool with_filter) {
  const int line = cur().line;
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    const bool neg = next().text == "-";
    DepthGuard g(*this);
    node = make(neg ? ExprKind::kNeg : ExprKind::kPos, line);
    node->args.push_back(parse_unary(false));
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr ExprParser::parse_primary() {
  const Token& tok = cur();
  if (tok.type == TokType::kName) {
    next();
    if (tok.text == "true" || tok.text == "True" || tok.text == "false" || tok.text == "False") {
      auto e = make(ExprKind::kConst, tok.line);
      e->value = Value(tok.text == "true" || tok.text == "True");
      return e;
    }
    if (tok.text == "none" || tok.text == "None") {
      auto e = make(ExprKind::kConst, tok.line);
      e->value = Value(None{});
      return e;
    }
    auto e = make(ExprKind::kName, tok.line);
    e->name = tok.text;
    return e;
  }
  if (tok.type == TokType::kString) {
    auto e = make(ExprKind::kConst, tok.line);
    std::string s;
    while (cur().type == TokType::kString) s += next().text;
    e->value = Value(std::move(s));
    return e;
  }
  if (tok.type == TokType::kInt || tok.type == TokType::kFloat) {
    auto e = make(ExprKind::kConst, tok.line);
    e->value = tok.type == TokType::kInt ? Value(tok.int_value) : Value(tok.float_value);
    next();
    return e;
  }
  if (is_op("(")) {
    next();
    DepthGuard g(*this);
    ExprPtr e = parse_tuple(false, true, {}, true);
    expect_op(")");
    return e;
  }
  if (is_op("[")) return parse_list();
  if (is_op("{")) return parse_dict();
  fail_here("unexpected " + cur_desc());
}

ExprPtr ExprParser::parse_list() {
  auto e = make(ExprKind::kList, next().line);
  DepthGuard g(*this);
  while (!is_op("]")) {
    if (!e->args.empty()) expect_op(",");
    if (is_op("]")) break;
    e->args.push_back(parse_expression(true));
  }
  expect_op("]");
  return e;
}

ExprPtr ExprParser::parse_dict() {
  auto e = make(ExprKind::kDict, next().line);
  DepthGuard g(*this);
  while (!is_op("}")) {
    if (!e->args.empty()) expect_op(",");
    if (is_op("}")) break;
    e->args.push_back(parse_expression(true));
    expect_op(":");
    e->args.push_back(parse_expression(true));
  }
  expect_op("}");
  return e;
}

ExprPtr ExprParser::parse_postfix(ExprPtr node) {
  for (;;) {
    if (is_op(".") || is_op("[")) {
      node = parse_subscript(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr ExprParser::parse_filter_expr(ExprPtr node) {
  for (;;) {
    if (is_op("|")) {
      next();
      node = parse_filter_call(std::move(node));
    } else if (is_name("is")) {
      node = parse_test(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr ExprParser::parse_subscript(ExprPtr node) {
  const Token& tok = next();
  if (tok.text == ".") {
    const Token& attr = cur();
    if (attr.type == TokType::kName) {
      next();
      auto e = make(ExprKind::kGetattr, tok.line);
      e->name = attr.text;
      e->args.push_back(std::move(node));
      return e;
    }
    if (attr.type != TokType::kInt) fail_here("expected name or number after '.'");
    next();
    auto idx = make(ExprKind::kConst, attr.line);
    idx->value = Value(attr.int_value);
    auto e = make(ExprKind::kGetitem, tok.line);
    e->args.push_back(std::move(node));
    e->args.push_back(std::move(idx));
    return e;
  }
  DepthGuard g(*this);
  std::vector<ExprPtr> subs;
  while (!is_op("]")) {
    if (!subs.empty()) expect_op(",");
    subs.push_back(parse_subscribed());
  }
  expect_op("]");
  if (subs.size() == 1 && subs[0]->kind == ExprKind::kSlice) {
    subs[0]->args[0] = std::move(node);
    return std::move(subs[0]);
  }
  auto e = make(ExprKind::kGetitem, tok.line);
  e->args.push_back(std::move(node));
  if (subs.size() == 1) {
    e->args.push_back(std::move(subs[0]));
  } else {
    for (const auto& s : subs)
      if (s->kind == ExprKind::kSlice) fail("multi-dimensional slices are not supported", tok.line);
    auto t = make(ExprKind::kTuple, tok.line);
    t->args = std::move(subs);
    e->args.push_back(std::move(t));
  }
  return e;
}

// An index expression or a slice (a kSlice whose args[0] is filled in by the caller).
ExprPtr ExprParser::parse_subscribed() {
  const int line = cur().line;
  ExprPtr start;
  if (!is_op(":")) {
    start = parse_expression(true);
    if (!is_op(":")) return start;
  }
  next();  // ':'
  auto e = make(ExprKind::kSlice, line);
  e->args.push_back(nullptr);
  e->args.push_back(std::move(start));
  e->args.push_back((is_op(":") || is_op("]") || is_op(",")) ? nullptr : parse_expression(true));
  if (skip_op(":")) {
    e->args.push_back((is_op("]") || is_op(",")) ? nullptr : parse_expression(true));
  } else {
    e->args.push_back(nullptr);
  }
  return e;
}

void ExprParser::parse_call_args(Expr& e) {
  const Token& open = expect_op("(");
  DepthGuard g(*this);
  bool require_comma = false;
  while (!is_op(")")) {
    if (require_comma) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (is_op("*") || is_op("**")) fail_here("*args / **kwargs in calls are not supported");
    if (cur().type == TokType::kName && look().type == TokType::kOp && look().text == "=") {
      std::string key = next().text;
      next();
      e.kwargs.push_back(Keyword{std::move(key), parse_expression(true)});
    } else {
      if (!e.kwargs.empty())
        fail("invalid syntax for function call expression (positional argument after keyword)",
             open.line);
      e.args.push_back(parse_expression(true));
    }
    require_comma = true;
  }
  expect_op(")");
}

ExprPtr ExprParser::parse_call(ExprPtr node) {
  auto e = make(ExprKind::kCall, cur().line);
  e->args.push_back(std::move(node));
  parse_call_args(*e);
  return e;
}

// After the '|': name [(args)]. `node` may be null (filter blocks, block sets).
ExprPtr ExprParser::parse_filter_call(ExprPtr node) {
  const Token& tok = expect_name();
  if (is_op(".")) fail_here("dotted filter names are not supported");
  auto e = make(ExprKind::kFilter, tok.line);
  e->name = tok.text;
  e->filter = find_filter(tok.text);
  if (!e->filter) fail("unknown filter '" + tok.text + "'", tok.line);
  e->args.push_back(std::move(node));
  if (is_op("(")) parse_call_args(*e);
  return e;
}

ExprPtr ExprParser::parse_test(ExprPtr node) {
  const int line = next().line;  // 'is'
  const bool negated = skip_name("not");
  const Token& tok = expect_name();
  if (is_op(".")) fail_here("dotted test names are not supported");
  auto e = make(ExprKind::kTest, line);
  e->name = tok.text;
  e->test = find_test(tok.text);
  if (!e->test) fail("unknown test '" + tok.text + "'", tok.line);
  e->args.push_back(std::move(node));
  if (is_op("(")) {
    parse_call_args(*e);
  } else if ((cur().type == TokType::kName || cur().type == TokType::kString ||
              cur().type == TokType::kInt || cur().type == TokType::kFloat || is_op("[") ||
              is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail_here("you cannot chain multiple tests with 'is'");
    e->args.push_back(parse_postfix(parse_primary()));
  }
  if (!negated) return e;
  auto n = make(ExprKind::kNot, line);
  n->args.push_back(std::move(e));
  return n;
}

}  // namespace miles::jinja
