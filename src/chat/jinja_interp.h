// The Jinja interpreter: evaluates a parsed template over Values, with jinja2's scoping rules.
//
// Why: the rendering rules that change output live here: a `{% for %}` body gets a fresh scope per
// iteration (a `set` inside a loop is gone after it, and the next iteration sees the outer value
// again), `if` bodies share their enclosing scope, macros see the template's globals, attribute
// lookup on a dict prefers its methods (`d.items`) and item lookup its keys, and a missing key is
// an Undefined that only fails when it is used. The filters, tests, methods and globals that
// templates call are implemented next to this in jinja_filters.cc, jinja_tests.cc, jinja_methods.cc
// and jinja_globals.cc.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace miles::jinja {

// One scope: names set in it, then its parent's.
struct Frame {
  explicit Frame(Frame* parent) : parent(parent) {}
  Frame* parent;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* lookup(std::string_view name) const;
  void set(std::string_view name, Value value);
};

enum class Flow : uint8_t { kNormal, kBreak, kContinue };

class Interp {
 public:
  // `root` holds the template's context variables; statements at top level set names in it.
  explicit Interp(Frame& root) : root_(root) {}
  // Empties the namespaces the render made: a namespace that holds itself is freed with it.
  ~Interp();
  Interp(const Interp&) = delete;
  Interp& operator=(const Interp&) = delete;

  std::string render(const Body& body);

  Flow exec(const Body& body, Frame& frame, std::string& out);
  Value eval(const Expr& e, Frame& frame);

  // Python/jinja2 semantics, shared with the built-ins.
  Value call(const Value& callee, Args& args);
  Value getattr(const Value& obj, std::string_view name);
  Value getitem(const Value& obj, const Value& key);
  // Follows a dotted path ("a.b.0") the way jinja2's attribute= arguments do.
  Value getattr_path(const Value& obj, std::string_view path);
  std::vector<Value> iterate(const Value& v);  // list items, dict keys, string code points
  bool contains(const Value& container, const Value& item);

  int line() const { return line_; }
  Frame& root() { return root_; }

  // Macro calls nest; recursion is bounded (jinja2 would hit Python's recursion limit).
  void enter_call();
  void leave_call() { --call_depth_; }
  // Each namespace() a render makes (freed with the Interp, cycles included).
  void adopt(Value::Namespace ns) { namespaces_.push_back(std::move(ns)); }

 private:
  Value eval_expr(const Expr& e, Frame& frame);  // eval without the guard and the count
  Flow exec_for(const Stmt& s, Frame& frame, std::string& out);
  void assign(const Stmt& s, Value value, Frame& frame);
  void bind_targets(const std::vector<std::string>& targets, const Value& item, Frame& frame);
  Value eval_call(const Expr& e, Frame& frame);
  void eval_args(const Expr& e, size_t first, Frame& frame, Args& out);
  Value eval_compare(const Expr& e, Frame& frame);
  Value eval_slice(const Expr& e, Frame& frame);
  Value make_macro(const Stmt& s);

  Frame& root_;
  // Bounds the C++ recursion of eval/exec (nested expressions x nested macro calls), and counts
  // each eval/exec as a step of the render (jinja_limits.h).
  struct DepthGuard {
    explicit DepthGuard(Interp& in);
    ~DepthGuard() { --in.depth_; }
    Interp& in;
  };

  int line_ = 0;
  int call_depth_ = 0;
  int depth_ = 0;
  std::vector<Value::Namespace> namespaces_;
};

// Python's binary operators (+ - * / // % **) on Values.
Value binary_op(std::string_view op, const Value& a, const Value& b);

// py::replace (str.replace and the replace filter), its result refused before it is built when
// too large: an empty `from` inserts `to` between every two characters.
std::string replace_bounded(const std::string& s, const std::string& from, const std::string& to,
                            int64_t count);

// Methods of str, list and dict (`s.startswith(...)`, `d.items()`); jinja_methods.cc.
// has_method is false for attributes that are not methods. Mutating methods (list.append,
// dict.update) are not methods here: getattr gives an Undefined that fails when used, as the
// immutable sandbox's "unsafe" attributes do.
bool has_method(const Value& obj, std::string_view name);
bool is_mutator(const Value& obj, std::string_view name);
Value call_method(Interp& in, const Value& obj, std::string_view name, Args& args);

// Globals: range, namespace, dict, raise_exception, strftime_now, joiner (Undefined otherwise).
Value lookup_global(std::string_view name);

// Filters and tests by name, for map('upper') and select('odd'); fail when unknown.
Value apply_filter(Interp& in, std::string_view name, const Value& v, Args& args);
bool apply_test(Interp& in, std::string_view name, const Value& v, Args& args);

// Python-style argument binding for built-ins: one slot per parameter name, null when not
// passed. Fails on too many positional arguments or an unknown keyword.
std::vector<const Value*> bind_args(std::string_view fn, const Args& args,
                                    std::initializer_list<const char*> params);

}  // namespace miles::jinja
