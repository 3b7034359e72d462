// Jinja's built-in filters, as jinja2/filters.py defines them, plus transformers' `tojson`.
//
// transformers replaces jinja2's tojson (which escapes <, >, & and sorts keys) with
// json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False): keys keep their
// order and non-ASCII text is written as is. That is the one here.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>

#include "chat/jinja_interp.h"
#include "chat/jinja_limits.h"
#include "chat/jinja_print.h"
#include "chat/py_text.h"

namespace miles::jinja {

std::vector<const Value*> bind_args(std::string_view fn, const Args& args,
                                    std::initializer_list<const char*> params) {
  std::vector<const Value*> out(params.size(), nullptr);
  if (args.pos.size() > params.size())
    fail(std::string(fn) + "() takes at most " + std::to_string(params.size()) +
         " argument(s), got " + std::to_string(args.pos.size()));
  for (size_t i = 0; i < args.pos.size(); ++i) out[i] = &args.pos[i];
  for (const auto& [k, v] : args.kw) {
    size_t i = 0;
    for (const char* p : params) {
      if (k == p) break;
      ++i;
    }
    if (i == params.size())
      fail(std::string(fn) + "() got an unexpected keyword argument '" + k + "'");
    if (out[i]) fail(std::string(fn) + "() got multiple values for argument '" + k + "'");
    out[i] = &v;
  }
  return out;
}

namespace {

bool arg_bool(const Value* v, bool dflt) { return v ? truthy(*v) : dflt; }

int64_t arg_int(const Value* v, int64_t dflt, const char* what) {
  if (!v) return dflt;
  if (!v->is_integral()) fail(std::string(what) + " must be an integer, not " + type_name(*v));
  return v->integral();
}

std::string arg_str(const Value* v, const std::string& dflt) { return v ? to_str(*v) : dflt; }

int64_t length_of(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(py::cp_len(v.as_string()));
  if (v.is_list()) return static_cast<int64_t>(v.as_list()->items.size());
  if (v.is_dict()) return static_cast<int64_t>(v.as_dict()->items.size());
  if (v.is_undefined()) return 0;
  fail("object of type '" + type_name(v) + "' has no len()");
}

// `width` spaces (indent=, width=), refused before they are built when too many.
std::string spaces(int64_t width) {
  const auto n = static_cast<uint64_t>(std::max<int64_t>(0, width));
  spend_bytes(n);
  return std::string(n, ' ');
}

// The key jinja2 sorts and compares by: an attribute path, lower-cased strings unless
// case_sensitive.
Value sort_key(Interp& in, const Value& v, const Value* attribute, bool case_sensitive) {
  Value k = attribute ? in.getattr_path(v, to_str(*attribute)) : v;
  if (!case_sensitive && k.is_string()) return Value(py::lower(k.as_string()));
  return k;
}

Value f_tojson(Interp&, const Value& v, Args& args) {
  const auto a = bind_args("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = arg_bool(a[0], false);
  if (a[1] && !a[1]->is_none()) {
    if (a[1]->is_string()) {
      o.indent = a[1]->as_string();
    } else {
      o.indent = spaces(arg_int(a[1], 0, "indent"));
    }
  }
  if (a[2] && !a[2]->is_none()) {
    if (!a[2]->is_list() || a[2]->as_list()->items.size() != 2)
      fail("tojson separators must be a pair of strings");
    o.separators =
        std::make_pair(to_str(a[2]->as_list()->items[0]), to_str(a[2]->as_list()->items[1]));
  }
  o.sort_keys = arg_bool(a[3], false);
  return Value(json_dumps(v, o));
}

Value f_trim(Interp&, const Value& v, Args& args) {
  const auto a = bind_args("trim", args, {"chars"});
  std::optional<std::string> chars;
  if (a[0] && !a[0]->is_none()) chars = to_str(*a[0]);
  return Value(py::strip(to_str(v), chars, true, true));
}

Value f_length(Interp&, const Value& v, Args& args) {
  bind_args("length", args, {});
  return Value(length_of(v));
}

Value f_default(Interp&, const Value& v, Args& args) {
  const auto a = bind_args("default", args, {"default_value", "boolean"});
  const bool boolean = arg_bool(a[1], false);
  if (v.is_undefined() || (boolean && !truthy(v))) return a[0] ? *a[0] : Value(std::string());
  return v;
}

Value f_upper(Interp&, const Value& v, Args& args) {
  bind_args("upper", args, {});
  return Value(py::upper(to_str(v)));
}
Value f_lower(Interp&, const Value& v, Args& args) {
  bind_args("lower", args, {});
  return Value(py::lower(to_str(v)));
}
Value f_capitalize(Interp&, const Value& v, Args& args) {
  bind_args("capitalize", args, {});
  return Value(py::capitalize(to_str(v)));
}

// jinja2's title: words start after '-', whitespace, '(', '{', '[' or '<'.
Value f_title(Interp&, const Value& v, Args& args) {
  bind_args("title", args, {});
  const std::string s = to_str(v);
  std::string out;
  bool word_start = true;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = py::next_cp(s, i);
    const bool sep = py::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    py::append_utf8(out, word_start ? py::to_upper(c) : py::to_lower(c));
    word_start = sep;
  }
  return Value(std::move(out));
}

Value f_replace(Interp&, const Value& v, Args& args) {
  const auto a = bind_args("replace", args, {"old", "new", "count"});
  if (!a[0] || !a[1]) fail("replace() needs old and new");
  const int64_t count = (a[2] && !a[2]->is_none()) ? arg_int(a[2], -1, "count") : -1;
  return Value(replace_bounded(to_str(v), to_str(*a[0]), to_str(*a[1]), count));
}

Value f_join(Interp& in, const Value& v, Args& args) {
  const auto a = bind_args("join", args, {"d", "attribute"});
  const std::string sep = arg_str(a[0], "");
  std::string out;
  bool first = true;
  for (const Value& item : in.iterate(v)) {
    if (!first) append_bounded(out, sep);
    first = false;
    append_bounded(out, to_str(a[1] ? in.getattr_path(item, to_str(*a[1])) : item));
  }
  return Value(std::move(out));
}

Value f_list(Interp& in, const Value& v, Args& args) {
  bind_args("list", args, {});
  return Value::list(in.iterate(v));
}

Value f_first(Interp& in, const Value& v, Args& args) {
  bind_args("first", args, {});
  const std::vector<Value> items = in.iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Interp& in, const Value& v, Args& args) {
  bind_args("last", args, {});
  const std::vector<Value> items = in.iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_reverse(Interp& in, const Value& v, Args& args) {
  bind_args("reverse", args, {});
  if (v.is_string()) {
    std::vector<char32_t> cps = py::to_cps(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value(py::from_cps(cps, 0, cps.size()));
  }
  std::vector<Value> items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_sort(Interp& in, const Value& v, Args& args) {
  const auto a = bind_args("sort", args, {"reverse", "case_sensitive", "attribute"});
  const bool rev = arg_bool(a[0], false), cs = arg_bool(a[1], false);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : in.iterate(v)) keyed.emplace_back(sort_key(in, item, a[2], cs), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return rev ? less(y.first, x.first) : less(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::list(std::move(out));
}

Value f_unique(Interp& in, const Value& v, Args& args) {
  const auto a = bind_args("unique", args, {"case_sensitive", "attribute"});
  std::vector<Value> seen, out;
  for (const Value& item : in.iterate(v)) {
    Value k = sort_key(in, item, a[1], arg_bool(a[0], false));
    spend_steps(seen.size());  // quadratic: unique over range(100000) would take hours
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); }))
      continue;
    seen.push_back(std::move(k));
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_map(Interp& in, const Value& v, Args& args) {
  std::vector<Value> out;
  if (const Value* attr = args.kwarg("attribute")) {
    const Value* dflt = args.kwarg("default");
    for (const Value& item : in.iterate(v)) {
      Value r = in.getattr_path(item, to_str(*attr));
      out.push_back((r.is_undefined() && dflt) ? *dflt : r);
    }
    return Value::list(std::move(out));
  }
  if (args.pos.empty()) fail("map requires a filter argument");
  const std::string name = to_str(args.pos[0]);
  Args rest;
  rest.pos.assign(args.pos.begin() + 1, args.pos.end());
  rest.kw = args.kw;
  for (const Value& item : in.iterate(v)) out.push_back(apply_filter(in, name, item, rest));
  return Value::list(std::move(out));
}

// select / reject / selectattr / rejectattr.
Value select_impl(Interp& in, const Value& v, Args& args, bool with_attr, bool keep_if) {
  size_t k = 0;
  std::string attr;
  if (with_attr) {
    if (args.pos.empty()) fail("selectattr/rejectattr need an attribute name");
    attr = to_str(args.pos[k++]);
  }
  std::optional<std::string> test;
  if (k < args.pos.size()) test = to_str(args.pos[k++]);
  Args rest;
  rest.pos.assign(args.pos.begin() + static_cast<std::ptrdiff_t>(k), args.pos.end());
  rest.kw = args.kw;
  std::vector<Value> out;
  for (const Value& item : in.iterate(v)) {
    const Value subject = with_attr ? in.getattr_path(item, attr) : item;
    const bool r = test ? apply_test(in, *test, subject, rest) : truthy(subject);
    if (r == keep_if) out.push_back(item);
  }
  return Value::list(std::move(out));
}
Value f_select(Interp& in, const Value& v, Args& a) { return select_impl(in, v, a, false, true); }
Value f_reject(Interp& in, const Value& v, Args& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interp& in, const Value& v, Args& a) {
  return select_impl(in, v, a, true, true);
}
Value f_rejectattr(Interp& in, const Value& v, Args& a) {
  return select_impl(in, v, a, true, false);
}

Value f_string(Interp&, const Value& v, Args& args) {
  bind_args("string", args, {});
  return Value(to_str(v));
}

// Python int(str, base): optional sign, whitespace around, underscores between digits, 0x/0o/0b.
std::optional<int64_t> parse_int(std::string s, int base) {
  s = py::strip(s, std::nullopt, true, true);
  if (s.empty()) return std::nullopt;
  std::string t;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] != '_' || (i > 0 && i + 1 < s.size())) t += s[i];
  errno = 0;
  char* end = nullptr;
  const long long r = std::strtoll(t.c_str(), &end, base);
  if (errno || end == t.c_str() || *end) return std::nullopt;
  return r;
}

std::optional<double> parse_float(const std::string& s) {
  const std::string t = py::strip(s, std::nullopt, true, true);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);
  if (*end) return std::nullopt;
  return d;
}

// int(x) of a finite float: truncated; past 64 bits an error, as every integer overflow here.
int64_t float_to_int(double d) {
  const double t = std::trunc(d);
  if (!(t >= -0x1p63 && t < 0x1p63)) fail("integer overflow (64-bit integers only)");
  return static_cast<int64_t>(t);
}

Value f_int(Interp&, const Value& v, Args& args) {
  const auto a = bind_args("int", args, {"default", "base"});
  const Value dflt = a[0] ? *a[0] : Value(0);
  const int base = static_cast<int>(arg_int(a[1], 10, "base"));
  if (v.is_integral()) return Value(v.integral());
  if (v.is_float()) return std::isfinite(v.as_float()) ? Value(float_to_int(v.as_float())) : dflt;
  if (v.is_string()) {
    if (auto i = parse_int(v.as_string(), base)) return Value(*i);
    if (auto d = parse_float(v.as_string()); d && std::isfinite(*d)) return Value(float_to_int(*d));
  }
  return dflt;
}

Value f_float(Interp&, const Value& v, Args& args) {
  const auto a = bind_args("float", args, {"default"});
  const Value dflt = a[0] ? *a[0] : Value(0.0);
  if (v.is_number()) return Value(v.number());
  if (v.is_string())
    if (auto d = parse_float(v.as_string())) return Value(*d);
  return dflt;
}

Value f_abs(Interp&, const Value& v, Args& args) {
  bind_args("abs", args, {});
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_integral()) {
    if (v.integral() == std::numeric_limits<int64_t>::min())
      fail("integer overflow (64-bit integers only)");
    return Value(v.integral() < 0 ? -v.integral() : v.integral());
  }
  fail("bad operand type for abs(): '" + type_name(v) + "'");
}

// Python round(x, n): correctly rounded, ties to even (glibc printf rounds the exact binary value).
double py_round(double x, int64_t n) {
  if (!std::isfinite(x)) return x;
  if (n < 0) {
    const double p = std::pow(10.0, static_cast<double>(-n));
    return std::nearbyint(x / p) * p;
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(n, 300)), x);
  return std::strtod(buf, nullptr);
}

Value f_round(Interp&, const Value& v, Args& args) {
  const auto a = bind_args("round", args, {"precision", "method"});
  const int64_t precision = arg_int(a[0], 0, "precision");
  const std::string method = arg_str(a[1], "common");
  if (!v.is_number()) fail("round filter needs a number, not " + type_name(v));
  const double x = v.number();
  if (method == "common") return Value(py_round(x, precision));
  const double p = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return Value(std::ceil(x * p) / p);
  if (method == "floor") return Value(std::floor(x * p) / p);
  fail("method must be common, ceil or floor");
}

Value f_items(Interp&, const Value& v, Args& args) {
  bind_args("items", args, {});
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, e] : v.as_dict()->items) out.push_back(Value::list({Value(k), e}, true));
  return Value::list(std::move(out));
}

Value f_dictsort(Interp&, const Value& v, Args& args) {
  const auto a = bind_args("dictsort", args, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) fail("dictsort needs a mapping");
  const bool cs = arg_bool(a[0], false), rev = arg_bool(a[2], false);
  const std::string by = arg_str(a[1], "key");
  if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
  std::vector<std::pair<std::string, Value>> items = v.as_dict()->items;
  auto key = [&](const std::pair<std::string, Value>& kv) {
    Value k = by == "key" ? Value(kv.first) : kv.second;
    return (!cs && k.is_string()) ? Value(py::lower(k.as_string())) : k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    return rev ? less(key(y), key(x)) : less(key(x), key(y));
  });
  std::vector<Value> out;
  for (auto& [k, e] : items) out.push_back(Value::list({Value(k), e}, true));
  return Value::list(std::move(out));
}

Value f_indent(Interp&, const Value& v, Args& args) {
  const auto a = bind_args("indent", args, {"width", "first", "blank"});
  const std::string ind =
      (a[0] && a[0]->is_string()) ? a[0]->as_string() : spaces(arg_int(a[0], 4, "width"));
  const bool first = arg_bool(a[1], false), blank = arg_bool(a[2], false);
  const std::string text = to_str(v);
  const std::vector<std::string> lines = py::splitlines(text + "\n", false);
  uint64_t size = 0;  // the text and an indent per line, at most
  if (__builtin_mul_overflow(lines.size() + 1, ind.size(), &size) ||
      __builtin_add_overflow(size, text.size(), &size))
    size = UINT64_MAX;
  spend_bytes(size);
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i == 0) {
      rv = lines[0];
      continue;
    }
    rv += "\n";
    if (blank || !lines[i].empty()) rv += ind;
    rv += lines[i];
  }
  if (first) rv = ind + rv;
  return Value(std::move(rv));
}

Value f_safe(Interp&, const Value& v, Args& args) {
  bind_args("safe", args, {});
  return Value(to_str(v));
}

Value f_escape(Interp&, const Value& v, Args& args) {
  bind_args("escape", args, {});
  std::string out;
  for (char c : to_str(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return Value(std::move(out));
}

Value f_sum(Interp& in, const Value& v, Args& args) {
  const auto a = bind_args("sum", args, {"attribute", "start"});
  Value total = a[1] ? *a[1] : Value(0);
  for (const Value& item : in.iterate(v))
    total = binary_op("+", total, a[0] ? in.getattr_path(item, to_str(*a[0])) : item);
  return total;
}

Value minmax(Interp& in, const Value& v, Args& args, bool want_max) {
  const auto a = bind_args(want_max ? "max" : "min", args, {"case_sensitive", "attribute"});
  const std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(in, items[0], a[1], arg_bool(a[0], false));
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(in, items[i], a[1], arg_bool(a[0], false));
    if (want_max ? less(best_key, k) : less(k, best_key)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}
Value f_min(Interp& in, const Value& v, Args& a) { return minmax(in, v, a, false); }
Value f_max(Interp& in, const Value& v, Args& a) { return minmax(in, v, a, true); }

Value f_wordcount(Interp&, const Value& v, Args& args) {
  bind_args("wordcount", args, {});
  const std::string s = to_str(v);
  int64_t n = 0;
  bool in_word = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = py::next_cp(s, i);
    const bool w = py::is_alpha(c) || py::is_digit(c) || c == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value f_center(Interp&, const Value& v, Args& args) {
  const auto a = bind_args("center", args, {"width"});
  const std::string s = to_str(v);
  const auto width = static_cast<size_t>(std::max<int64_t>(0, arg_int(a[0], 80, "width")));
  const size_t n = py::cp_len(s);
  if (n >= width) return Value(s);
  const size_t total = width - n;
  spend_bytes(s.size() + total);
  const size_t left = total / 2 + (total & width & 1);  // CPython's pad split
  return Value(std::string(left, ' ') + s + std::string(total - left, ' '));
}

Value f_format(Interp&, const Value& v, Args& args) {
  if (!args.kw.empty() && !args.pos.empty())
    fail("can't handle positional and keyword arguments at the same time");
  if (!args.kw.empty()) {
    Value d = Value::dict();
    for (const auto& [k, e] : args.kw) d.as_dict()->set(k, e);
    return Value(percent_format(to_str(v), d));
  }
  return Value(percent_format(to_str(v), Value::list(args.pos, true)));
}

Value f_attr(Interp& in, const Value& v, Args& args) {
  const auto a = bind_args("attr", args, {"name"});
  if (!a[0]) fail("attr() needs a name");
  return in.getattr(v, to_str(*a[0]));
}

const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> table = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"format", f_format},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return table;
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  const auto& t = filters();
  const auto it = t.find(name);
  return it == t.end() ? nullptr : it->second;
}

Value apply_filter(Interp& in, std::string_view name, const Value& v, Args& args) {
  spend_steps();  // map('...') calls it once per item
  const FilterFn f = find_filter(name);
  if (!f) fail("unknown filter '" + std::string(name) + "'");
  return f(in, v, args);
}

}  // namespace miles::jinja
