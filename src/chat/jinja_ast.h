// The parsed form of a Jinja template: expression and statement trees.
//
// Why: parsing once into a tree (instead of re-scanning text at render time) is what lets a chat
// template be rendered many times per second by the session layer, and lets unknown tags, filters
// and tests be reported when the template is loaded, with their line, rather than mid-request.
// One generic node type per tree keeps the parser and the interpreter short; each kind documents
// which fields it uses.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/jinja_value.h"

namespace miles::jinja {

class Interp;
using FilterFn = Value (*)(Interp&, const Value& subject, Args& args);
using TestFn = bool (*)(Interp&, const Value& subject, Args& args);

enum class ExprKind : uint8_t {
  kConst,    // value
  kName,     // name
  kGetattr,  // args[0].name
  kGetitem,  // args[0][args[1]]
  kSlice,    // args[0][args[1]:args[2]:args[3]]; absent parts are null
  kCall,     // args[0](args[1:], kwargs)
  kFilter,   // args[0] | name(args[1:], kwargs); filter set; args[0] null in a filter block
  kTest,     // args[0] is name(args[1:], kwargs); test set
  kNeg,      // -args[0]
  kPos,      // +args[0]
  kNot,      // not args[0]
  kBinary,   // args[0] name args[1], name one of + - * / // % **
  kAnd,      // args[0] and args[1] (Python: returns an operand)
  kOr,       // args[0] or args[1]
  kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ... (ops: == != < <= > >= in notin)
  kConcat,   // args joined with ~
  kCond,     // args[0] if args[1] else args[2] (args[2] null: Undefined)
  kList,     // [args...]
  kTuple,    // (args...)
  kDict,     // {args[0]: args[1], args[2]: args[3], ...}
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Keyword {
  std::string name;
  ExprPtr value;
};

struct Expr {
  ExprKind kind;
  int line = 0;
  std::string name;
  Value value;
  std::vector<ExprPtr> args;
  std::vector<Keyword> kwargs;
  std::vector<std::string> ops;
  FilterFn filter = nullptr;
  TestFn test = nullptr;
};

enum class StmtKind : uint8_t {
  kText,         // text
  kPrint,        // {{ expr }}
  kIf,           // exprs[i] guards bodies[i]; bodies[exprs.size()] (optional) is the else
  kFor,          // for targets in expr [if cond]: bodies[0], else bodies[1]
  kSet,          // set targets = expr; ns_attr: targets = {namespace, attribute}
  kSetBlock,     // set targets[0] (| filters in exprs) %} bodies[0] {% endset
  kMacro,        // macro name(targets = exprs (null: no default)) bodies[0]
  kWith,         // with targets = exprs: bodies[0]
  kFilterBlock,  // filter exprs (a chain of kFilter with a null subject): bodies[0]
  kScope,        // bodies[0] rendered as is (transformers' {% generation %})
  kBreak,
  kContinue,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  std::string name;
  std::vector<std::string> targets;
  bool ns_attr = false;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<ExprPtr> exprs;
  std::vector<Body> bodies;
};

// Built-in filters and tests by name (nullptr when unknown); jinja_filters.cc / jinja_tests.cc.
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);

}  // namespace miles::jinja
