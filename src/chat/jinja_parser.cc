// Jinja statement parser (see jinja_parser.h). Function names follow jinja2/parser.py.
#include "chat/jinja_parser.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "chat/jinja_expr_parser.h"

namespace miles::jinja {
namespace {

class Parser : public ExprParser {
 public:
  using ExprParser::ExprParser;

  Body parse_template() {
    Body body = subparse({});
    if (cur().type != TokType::kEof) fail_here("unexpected '" + cur().text + "'");
    return body;
  }

 private:
  Body subparse(std::initializer_list<std::string_view> end_tags) {
    Body body;
    for (;;) {
      const Token& tok = cur();
      if (tok.type == TokType::kEof) return body;
      if (tok.type == TokType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = tok.line;
        s->text = tok.text;
        body.push_back(std::move(s));
        next();
      } else if (tok.type == TokType::kVarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kPrint;
        s->line = tok.line;
        s->expr = parse_tuple(false, true, {}, false);
        if (cur().type != TokType::kVarEnd)
          fail_here("expected end of print statement ('}}'), got " + cur_desc());
        next();
        body.push_back(std::move(s));
      } else if (tok.type == TokType::kBlockBegin) {
        next();
        for (std::string_view e : end_tags)
          if (is_name(e)) return body;
        body.push_back(parse_statement());
        expect_block_end();
      } else {
        fail_here("unexpected " + cur_desc());
      }
    }
  }

  // The body up to one of `end_tags` (the tag name is left as the current token).
  Body parse_statements(std::initializer_list<std::string_view> end_tags, bool drop_needle,
                        int open_line, std::string_view block) {
    skip_op(":");
    expect_block_end();
    DepthGuard g(*this);
    Body body = subparse(end_tags);
    if (cur().type == TokType::kEof) {
      std::string expected;
      for (std::string_view e : end_tags)
        expected += (expected.empty() ? "'" : " or '") + std::string(e) + "'";
      fail("unexpected end of template: the '" + std::string(block) + "' block opened on line " +
               std::to_string(open_line) + " is not closed (expected " + expected + ")",
           cur().line);
    }
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement() {
    const Token& tok = cur();
    if (tok.type != TokType::kName) fail_here("tag name expected, got " + cur_desc());
    const std::string& n = tok.text;
    if (n == "for") return parse_for();
    if (n == "if") return parse_if();
    if (n == "set") return parse_set();
    if (n == "macro") return parse_macro();
    if (n == "with") return parse_with();
    if (n == "filter") return parse_filter_block();
    if (n == "generation") return parse_scope("endgeneration");
    if (n == "print") return parse_print();
    if (n == "break" || n == "continue") {
      if (loop_depth_ == 0) fail_here("'" + n + "' outside of a loop");
      auto s = std::make_unique<Stmt>();
      s->kind = n == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      s->line = tok.line;
      next();
      return s;
    }
    for (const char* unsupported : {"include", "import", "from", "extends", "block", "call", "do",
                                    "trans", "autoescape", "raw"})
      if (n == unsupported) fail_here("the '" + n + "' tag is not supported in chat templates");
    if (n.rfind("end", 0) == 0 || n == "else" || n == "elif")
      fail_here("unexpected '" + n + "' (no open block it could close here)");
    fail_here("unknown tag '" + n + "'");
  }

  StmtPtr new_stmt(StmtKind k) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = cur().line;
    return s;
  }

  // Assignment targets: a name, a namespace attribute (ns.attr), or a tuple of names.
  void parse_assign_target(Stmt& s, bool with_tuple, bool with_namespace,
                           std::string_view extra_end) {
    const Token& first = expect_name();
    if (with_namespace && is_op(".")) {
      next();
      s.ns_attr = true;
      s.targets = {first.text, expect_name().text};
      return;
    }
    s.targets.push_back(first.text);
    if (!with_tuple) return;
    while (skip_op(",")) {
      if (cur().type == TokType::kBlockEnd || is_op("=") ||
          (!extra_end.empty() && is_name(extra_end)))
        break;
      s.targets.push_back(expect_name().text);
    }
  }

  StmtPtr parse_for() {
    auto s = new_stmt(StmtKind::kFor);
    next();
    parse_assign_target(*s, true, false, "in");
    expect_name("in");
    s->expr = parse_tuple(false, false, "recursive", false);
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name("recursive")) fail_here("recursive loops are not supported");
    ++loop_depth_;
    s->bodies.push_back(parse_statements({"endfor", "else"}, false, s->line, "for"));
    --loop_depth_;
    if (next().text == "endfor") {
      s->bodies.emplace_back();
    } else {
      s->bodies.push_back(parse_statements({"endfor"}, true, s->line, "for"));
    }
    return s;
  }

  StmtPtr parse_if() {
    auto s = new_stmt(StmtKind::kIf);
    next();
    for (;;) {
      s->exprs.push_back(parse_tuple(false, false, {}, false));
      s->bodies.push_back(parse_statements({"elif", "else", "endif"}, false, s->line, "if"));
      const Token& tok = next();
      if (tok.text == "elif") continue;
      if (tok.text == "else") s->bodies.push_back(parse_statements({"endif"}, true, s->line, "if"));
      break;
    }
    return s;
  }

  StmtPtr parse_set() {
    auto s = new_stmt(StmtKind::kSet);
    next();
    parse_assign_target(*s, true, true, {});
    if (skip_op("=")) {
      s->expr = parse_tuple(false, true, {}, false);
      return s;
    }
    if (s->ns_attr || s->targets.size() != 1) fail_here("a block set takes a single name");
    s->kind = StmtKind::kSetBlock;
    while (is_op("|")) {
      next();
      s->exprs.push_back(parse_filter_call(nullptr));
    }
    s->bodies.push_back(parse_statements({"endset"}, true, s->line, "set"));
    return s;
  }

  StmtPtr parse_macro() {
    auto s = new_stmt(StmtKind::kMacro);
    next();
    s->name = expect_name().text;
    expect_op("(");
    while (!is_op(")")) {
      if (!s->targets.empty()) expect_op(",");
      if (is_op(")")) break;
      s->targets.push_back(expect_name().text);
      if (skip_op("=")) {
        s->exprs.push_back(parse_expression(true));
      } else {
        if (!s->exprs.empty() && s->exprs.back())
          fail_here("non-default argument follows default argument");
        s->exprs.push_back(nullptr);
      }
    }
    next();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->bodies.push_back(parse_statements({"endmacro"}, true, s->line, "macro"));
    loop_depth_ = saved;
    return s;
  }

  StmtPtr parse_with() {
    auto s = new_stmt(StmtKind::kWith);
    next();
    while (cur().type != TokType::kBlockEnd) {
      if (!s->targets.empty()) expect_op(",");
      s->targets.push_back(expect_name().text);
      expect_op("=");
      s->exprs.push_back(parse_expression(true));
    }
    s->bodies.push_back(parse_statements({"endwith"}, true, s->line, "with"));
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = new_stmt(StmtKind::kFilterBlock);
    next();
    s->exprs.push_back(parse_filter_call(nullptr));
    while (is_op("|")) {
      next();
      s->exprs.push_back(parse_filter_call(nullptr));
    }
    s->bodies.push_back(parse_statements({"endfilter"}, true, s->line, "filter"));
    return s;
  }

  StmtPtr parse_scope(std::string_view end_tag) {
    auto s = new_stmt(StmtKind::kScope);
    const std::string tag = next().text;
    s->bodies.push_back(parse_statements({end_tag}, true, s->line, tag));
    return s;
  }

  StmtPtr parse_print() {
    auto s = new_stmt(StmtKind::kPrint);
    next();
    s->expr = parse_tuple(false, true, {}, false);
    return s;
  }

  int loop_depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace miles::jinja
