// Expression evaluation with Python semantics: operators, attribute and item lookup, calls.
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

#include "chat/jinja_interp.h"
#include "chat/jinja_limits.h"
#include "chat/jinja_print.h"
#include "chat/py_text.h"

namespace miles::jinja {
namespace {

std::string object_repr(const Value& v) {
  if (v.is_none()) return "None";
  return type_name(v) + " object";
}

Value undefined_attr(const Value& obj, std::string_view name) {
  return Value::undefined("'" + object_repr(obj) + "' has no attribute '" + std::string(name) +
                          "'");
}

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for " + std::string(op) + ": '" + type_name(a) + "' and '" +
       type_name(b) + "'");
}

int64_t checked(bool overflow, int64_t v) {
  if (overflow) fail("integer overflow (64-bit integers only)");
  return v;
}

int64_t floor_div(int64_t a, int64_t b) {
  if (a == std::numeric_limits<int64_t>::min() && b == -1)
    fail("integer overflow (64-bit integers only)");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// n * size, or UINT64_MAX when that overflows (spend_bytes refuses it).
uint64_t times(int64_t n, uint64_t size) {
  uint64_t r = 0;
  return __builtin_mul_overflow(static_cast<uint64_t>(n), size, &r) ? UINT64_MAX : r;
}

Value repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    spend_bytes(times(n, s.size()));
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) out += s;
    return Value(std::move(out));
  }
  const ListData& l = *seq.as_list();
  spend_bytes(times(n, copy_bytes(l.items)));
  std::vector<Value> out;
  for (int64_t k = 0; k < n; ++k) out.insert(out.end(), l.items.begin(), l.items.end());
  return Value::list(std::move(out), l.tuple);
}

}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool nums = a.is_number() && b.is_number();
  const bool ints = a.is_integral() && b.is_integral();
  if (op == "+") {
    if (ints) {
      int64_t r = 0;
      const bool overflow = __builtin_add_overflow(a.integral(), b.integral(), &r);
      return Value(checked(overflow, r));
    }
    if (nums) return Value(a.number() + b.number());
    if (a.is_string() && b.is_string()) {
      spend_bytes(a.as_string().size() + b.as_string().size());  // sum(start='') adds in a loop
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.as_list()->tuple == b.as_list()->tuple) {
      spend_bytes(copy_bytes(a.as_list()->items) + copy_bytes(b.as_list()->items));
      std::vector<Value> items = a.as_list()->items;
      items.insert(items.end(), b.as_list()->items.begin(), b.as_list()->items.end());
      return Value::list(std::move(items), a.as_list()->tuple);
    }
    if (a.is_string() || a.is_list())
      fail("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " +
           type_name(a));
    unsupported("+", a, b);
  }
  if (op == "-") {
    if (ints) {
      int64_t r = 0;
      const bool overflow = __builtin_sub_overflow(a.integral(), b.integral(), &r);
      return Value(checked(overflow, r));
    }
    if (nums) return Value(a.number() - b.number());
    unsupported("-", a, b);
  }
  if (op == "*") {
    if (ints) {
      int64_t r = 0;
      const bool overflow = __builtin_mul_overflow(a.integral(), b.integral(), &r);
      return Value(checked(overflow, r));
    }
    if (nums) return Value(a.number() * b.number());
    if ((a.is_string() || a.is_list()) && b.is_integral()) return repeat(a, b.integral());
    if (a.is_integral() && (b.is_string() || b.is_list())) return repeat(b, a.integral());
    fail("can't multiply sequence by non-int of type '" + type_name(b) + "'");
  }
  if (op == "/") {
    if (!nums) unsupported("/", a, b);
    if (b.number() == 0) fail("division by zero");
    return Value(a.number() / b.number());
  }
  if (op == "//") {
    if (!nums) unsupported("//", a, b);
    if (b.number() == 0) fail("integer division or modulo by zero");
    if (ints) return Value(floor_div(a.integral(), b.integral()));
    return Value(std::floor(a.number() / b.number()));
  }
  if (op == "%") {
    if (a.is_string()) return Value(percent_format(a.as_string(), b));
    if (!nums) unsupported("%", a, b);
    if (b.number() == 0) fail("integer division or modulo by zero");
    if (ints) {
      const int64_t x = a.integral(), y = b.integral();
      return Value(y == -1 ? int64_t{0} : x - floor_div(x, y) * y);
    }
    double m = std::fmod(a.number(), b.number());
    if (m != 0 && ((m < 0) != (b.number() < 0))) m += b.number();
    return Value(m);
  }
  if (op == "**") {
    if (!nums) unsupported("** or pow()", a, b);
    if (ints && b.integral() >= 0) {
      int64_t r = 1, base = a.integral(), exp = b.integral();
      while (exp > 0) {
        if ((exp & 1) && __builtin_mul_overflow(r, base, &r))
          fail("integer overflow (64-bit integers only)");
        exp >>= 1;
        if (exp && __builtin_mul_overflow(base, base, &base))
          fail("integer overflow (64-bit integers only)");
      }
      return Value(r);
    }
    return Value(std::pow(a.number(), b.number()));
  }
  fail("unknown operator '" + std::string(op) + "'");
}

Value Interp::getattr(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_namespace()) {
    const Value* v = obj.as_namespace()->attrs.find(name);
    return v ? *v : undefined_attr(obj, name);
  }
  if (is_mutator(obj, name))
    return Value::undefined("access to attribute '" + std::string(name) + "' of '" +
                            type_name(obj) + "' object is unsafe (templates cannot modify it)");
  if (has_method(obj, name)) {
    const std::string method(name);
    auto fn = std::make_shared<Callable>();
    fn->name = type_name(obj) + "." + method;
    fn->bound = std::make_shared<const Value>(obj);
    fn->fn = [self = fn.get(), method](Interp& in, Args& args) {
      return call_method(in, *self->bound, method, args);
    };
    return Value(std::move(fn));
  }
  if (obj.is_dict()) {
    const Value* v = obj.as_dict()->find(name);
    return v ? *v : undefined_attr(obj, name);
  }
  return undefined_attr(obj, name);
}

Value Interp::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.as_dict()->find(key.as_string())) return *v;
  }
  if ((obj.is_list() || obj.is_string()) && key.is_integral()) {
    int64_t i = key.integral();
    if (obj.is_list()) {
      const auto& items = obj.as_list()->items;
      const auto n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
    } else {
      const std::vector<size_t> offs = py::cp_offsets(obj.as_string());
      const auto n = static_cast<int64_t>(offs.size()) - 1;
      if (i < 0) i += n;
      if (i >= 0 && i < n)
        return Value(obj.as_string().substr(
            offs[static_cast<size_t>(i)],
            offs[static_cast<size_t>(i) + 1] - offs[static_cast<size_t>(i)]));
    }
    return Value::undefined(object_repr(obj) + " has no element " + to_str(key));
  }
  if (key.is_string()) return getattr(obj, key.as_string());
  return Value::undefined(object_repr(obj) + " has no element " + repr(key));
}

Value Interp::getattr_path(const Value& obj, std::string_view path) {
  Value cur = obj;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string_view part = path.substr(start, dot - start);
    int64_t index = 0;
    const bool numeric = !part.empty() &&
                         part.find_first_not_of("0123456789") == std::string::npos &&
                         std::from_chars(part.data(), part.data() + part.size(), index).ec ==
                             std::errc();  // too many digits: no such item, as in Python
    cur = numeric ? getitem(cur, Value(index)) : getitem(cur, Value(std::string(part)));
    if (dot == std::string_view::npos) return cur;
    start = dot + 1;
  }
}

std::vector<Value> Interp::iterate(const Value& v) {
  if (v.is_list()) {
    spend_bytes(copy_bytes(v.as_list()->items));
    return v.as_list()->items;
  }
  if (v.is_undefined()) return {};
  if (v.is_dict()) {
    std::vector<Value> keys;
    for (const auto& kv : v.as_dict()->items) keys.emplace_back(kv.first);
    spend_bytes(copy_bytes(keys));
    return keys;
  }
  if (v.is_string()) {
    std::vector<Value> chars;
    const std::string& s = v.as_string();
    spend_bytes(py::cp_len(s) * sizeof(Value) + s.size());  // before a Value per character
    for (size_t i = 0; i < s.size();) {
      const size_t start = i;
      py::next_cp(s, i);
      chars.emplace_back(s.substr(start, i - start));
    }
    return chars;
  }
  fail("'" + type_name(v) + "' object is not iterable");
}

bool Interp::contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string())
      fail("'in <string>' requires string as left operand, not " + type_name(item));
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& e : container.as_list()->items)
      if (equals(e, item)) return true;
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.as_dict()->find(item.as_string());
  if (container.is_undefined()) return false;
  fail("argument of type '" + type_name(container) + "' is not iterable");
}

Value Interp::call(const Value& callee, Args& args) {
  if (callee.is_callable()) return callee.as_callable()->fn(*this, args);
  if (callee.is_undefined()) fail_undefined(callee);
  fail("'" + type_name(callee) + "' object is not callable");
}

void Interp::eval_args(const Expr& e, size_t first, Frame& frame, Args& out) {
  for (size_t i = first; i < e.args.size(); ++i) out.pos.push_back(eval(*e.args[i], frame));
  for (const Keyword& k : e.kwargs) out.kw.emplace_back(k.name, eval(*k.value, frame));
}

Value Interp::eval_call(const Expr& e, Frame& frame) {
  const Expr& callee = *e.args[0];
  Args args;
  if (callee.kind == ExprKind::kGetattr) {
    const Value obj = eval(*callee.args[0], frame);
    if (!obj.is_undefined() && has_method(obj, callee.name)) {
      eval_args(e, 1, frame, args);
      line_ = e.line;
      return call_method(*this, obj, callee.name, args);
    }
    line_ = callee.line;
    const Value fn = getattr(obj, callee.name);
    eval_args(e, 1, frame, args);
    line_ = e.line;
    return call(fn, args);
  }
  const Value fn = eval(callee, frame);
  eval_args(e, 1, frame, args);
  line_ = e.line;
  return call(fn, args);
}

Value Interp::eval_compare(const Expr& e, Frame& frame) {
  Value left = eval(*e.args[0], frame);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.args[i + 1], frame);
    line_ = e.line;
    const std::string& op = e.ops[i];
    bool r;
    if (op == "==") {
      r = equals(left, right);
    } else if (op == "!=") {
      r = !equals(left, right);
    } else if (op == "<") {
      r = less(left, right);
    } else if (op == ">") {
      r = less(right, left);
    } else if (op == "<=") {
      r = less(left, right) || equals(left, right);
    } else if (op == ">=") {
      r = less(right, left) || equals(left, right);
    } else if (op == "in") {
      r = contains(right, left);
    } else {
      r = !contains(right, left);
    }
    if (!r) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

namespace {

// Python's slice.indices(n): (start, stop, step) clamped.
void slice_indices(const Value& vs, const Value& ve, const Value& vp, int64_t n, int64_t& start,
                   int64_t& stop, int64_t& step) {
  auto get = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_integral()) fail(std::string("slice ") + what + " must be an integer or None");
    return v.integral();
  };
  step = get(vp, "step").value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  auto adjust = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x;
    if (v < 0) {
      v += n;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= n) {
      v = step < 0 ? n - 1 : n;
    }
    return v;
  };
  start = adjust(get(vs, "start"), step < 0 ? n - 1 : 0);
  stop = adjust(get(ve, "stop"), step < 0 ? -1 : n);
}

}  // namespace

Value Interp::eval_slice(const Expr& e, Frame& frame) {
  const Value obj = eval(*e.args[0], frame);
  const Value none{None{}};
  const Value s = e.args[1] ? eval(*e.args[1], frame) : none;
  const Value t = e.args[2] ? eval(*e.args[2], frame) : none;
  const Value p = e.args[3] ? eval(*e.args[3], frame) : none;
  line_ = e.line;
  if (obj.is_undefined()) fail_undefined(obj);
  if (!obj.is_list() && !obj.is_string())
    fail("'" + type_name(obj) + "' object is not subscriptable");
  std::vector<char32_t> cps;
  if (obj.is_string()) cps = py::to_cps(obj.as_string());
  const auto n = static_cast<int64_t>(obj.is_string() ? cps.size() : obj.as_list()->items.size());
  int64_t start, stop, step;
  slice_indices(s, t, p, n, start, stop, step);
  std::vector<size_t> picked;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
    picked.push_back(static_cast<size_t>(i));
  if (obj.is_string()) {
    std::string out;
    for (size_t i : picked) py::append_utf8(out, cps[i]);
    return Value(std::move(out));
  }
  std::vector<Value> items;
  for (size_t i : picked) items.push_back(obj.as_list()->items[i]);
  return Value::list(std::move(items), obj.as_list()->tuple);
}

Value Interp::eval(const Expr& e, Frame& frame) {
  const DepthGuard guard(*this);
  Value v = eval_expr(e, frame);
  if (v.is_string()) spend_bytes(v.as_string().size());  // built, or copied out of a variable
  return v;
}

Value Interp::eval_expr(const Expr& e, Frame& frame) {
  line_ = e.line;
  switch (e.kind) {
    case ExprKind::kConst:
      return e.value;
    case ExprKind::kName: {
      if (const Value* v = frame.lookup(e.name)) return *v;
      Value g = lookup_global(e.name);
      if (!g.is_undefined()) return g;
      return Value::undefined("'" + e.name + "' is undefined");
    }
    case ExprKind::kGetattr: {
      const Value obj = eval(*e.args[0], frame);
      line_ = e.line;
      return getattr(obj, e.name);
    }
    case ExprKind::kGetitem: {
      const Value obj = eval(*e.args[0], frame);
      const Value key = eval(*e.args[1], frame);
      line_ = e.line;
      return getitem(obj, key);
    }
    case ExprKind::kSlice:
      return eval_slice(e, frame);
    case ExprKind::kCall:
      return eval_call(e, frame);
    case ExprKind::kFilter: {
      const Value subject = eval(*e.args[0], frame);
      Args args;
      eval_args(e, 1, frame, args);
      line_ = e.line;
      return e.filter(*this, subject, args);
    }
    case ExprKind::kTest: {
      const Value subject = eval(*e.args[0], frame);
      Args args;
      eval_args(e, 1, frame, args);
      line_ = e.line;
      return Value(e.test(*this, subject, args));
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      const Value v = eval(*e.args[0], frame);
      line_ = e.line;
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number())
        fail(std::string("bad operand type for unary ") + (e.kind == ExprKind::kNeg ? "-" : "+") +
             ": '" + type_name(v) + "'");
      if (e.kind == ExprKind::kPos) return v.is_bool() ? Value(v.integral()) : v;
      if (v.is_float()) return Value(-v.as_float());
      if (v.integral() == std::numeric_limits<int64_t>::min()) fail("integer overflow");
      return Value(-v.integral());
    }
    case ExprKind::kNot:
      return Value(!truthy(eval(*e.args[0], frame)));
    case ExprKind::kBinary: {
      const Value a = eval(*e.args[0], frame);
      const Value b = eval(*e.args[1], frame);
      line_ = e.line;
      return binary_op(e.name, a, b);
    }
    case ExprKind::kAnd: {
      Value a = eval(*e.args[0], frame);
      return truthy(a) ? eval(*e.args[1], frame) : a;
    }
    case ExprKind::kOr: {
      Value a = eval(*e.args[0], frame);
      return truthy(a) ? a : eval(*e.args[1], frame);
    }
    case ExprKind::kCompare:
      return eval_compare(e, frame);
    case ExprKind::kConcat: {
      std::string out;
      for (const auto& part : e.args) append_bounded(out, to_str(eval(*part, frame)));
      return Value(std::move(out));
    }
    case ExprKind::kCond:
      if (truthy(eval(*e.args[1], frame))) return eval(*e.args[0], frame);
      if (e.args[2]) return eval(*e.args[2], frame);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) items.push_back(eval(*a, frame));
      return Value::list(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i], frame);
        Value v = eval(*e.args[i + 1], frame);
        if (!k.is_string())
          fail("dict literal keys must be strings here, got " + type_name(k), e.line);
        d.as_dict()->set(k.as_string(), std::move(v));
      }
      return d;
    }
  }
  fail("unknown expression kind");
}

}  // namespace miles::jinja
