// Python's str(), repr(), json.dumps(), '%' formatting and str.format (see jinja_print.h).
#include "chat/jinja_print.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>

#include "chat/jinja_limits.h"
#include "chat/py_text.h"

namespace miles::jinja {

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);  // shortest round-trip: "-1.2345e+02", "0e+00"
  std::string out;
  size_t p = 0;
  if (sci[0] == '-') {
    out += '-';
    p = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t k = p; k < e; ++k)
    if (sci[k] != '.') digits += sci[k];
  const int exp10 = std::stoi(sci.substr(e + 1));
  const int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  const int nd = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (decpt >= nd) {
      out += digits + std::string(static_cast<size_t>(decpt - nd), '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (nd > 1) out += "." + digits.substr(1);
  const int x = decpt - 1;
  char eb[16];
  std::snprintf(eb, sizeof(eb), "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
  return out + eb;
}

namespace {

bool printable(char32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c <= 0xA0 || c == 0xAD || c == 0x1680 || c == 0x180E || c == 0x061C || c == 0x06DD ||
      c == 0x070F || c == 0x3000 || c == 0xFEFF)
    return false;
  if ((c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
      (c >= 0x205F && c <= 0x206F) || (c >= 0xD800 && c <= 0xF8FF) ||
      (c >= 0xFFF9 && c <= 0xFFFB) || (c >= 0x600 && c <= 0x605) || c >= 0xE0000)
    return false;
  return true;
}

void hex_escape(std::string& out, char32_t c) {
  char b[16];
  if (c < 0x100) {
    std::snprintf(b, sizeof(b), "\\x%02x", static_cast<unsigned>(c));
  } else if (c < 0x10000) {
    std::snprintf(b, sizeof(b), "\\u%04x", static_cast<unsigned>(c));
  } else {
    std::snprintf(b, sizeof(b), "\\U%08x", static_cast<unsigned>(c));
  }
  out += b;
}

}  // namespace

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    const char32_t c = py::next_cp(s, i);
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!printable(c)) {
      hex_escape(out, c);
    } else {
      py::append_utf8(out, c);
    }
  }
  out += q;
  return out;
}

// Every value printed counts as a step and its text against the render's limits: a list that
// holds itself twice, nested forty times, prints 2^40 items.
std::string repr(const Value& v) {
  const NestingGuard nest;
  spend_steps();
  if (v.is_undefined()) return "Undefined";
  if (v.is_string()) return string_repr(v.as_string());
  if (v.is_list()) {
    const ListData& l = *v.as_list();
    std::string out = l.tuple ? "(" : "[";
    for (size_t i = 0; i < l.items.size(); ++i) {
      if (i) out += ", ";
      append_bounded(out, repr(l.items[i]));
    }
    if (l.tuple && l.items.size() == 1) out += ",";
    return out + (l.tuple ? ")" : "]");
  }
  if (v.is_dict()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, e] : v.as_dict()->items) {
      if (!first) out += ", ";
      first = false;
      append_bounded(out, string_repr(k) + ": ");
      append_bounded(out, repr(e));
    }
    return out + "}";
  }
  return to_str(v);
}

std::string to_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_none()) return "None";
  if (v.is_bool()) return v.as_bool() ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return float_repr(v.as_float());
  if (v.is_string()) return v.as_string();
  if (v.is_list() || v.is_dict()) return repr(v);
  if (v.is_namespace()) {
    const NestingGuard nest;  // a namespace may hold itself
    Value d = Value::dict();
    d.as_dict()->items = v.as_namespace()->attrs.items;
    return "<Namespace " + repr(d) + ">";
  }
  return "<function " + v.as_callable()->name + ">";
}

// ---- json.dumps -------------------------------------------------------------------------------

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b >= 0x80) {
      const size_t start = i;
      const char32_t c = py::next_cp(s, i);
      if (!ensure_ascii) {
        out.append(s, start, i - start);
        continue;
      }
      char buf[16];
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + static_cast<unsigned>(v >> 10),
                      0xDC00 + static_cast<unsigned>(v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
      continue;
    }
    ++i;
    switch (b) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (b < 0x20 || (ensure_ascii && b == 0x7F)) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", b);
          out += buf;
        } else {
          out += static_cast<char>(b);
        }
    }
  }
  out += '"';
}

struct Dumper {
  const JsonDumpOptions& o;
  std::string item_sep, key_sep;
  std::string out;

  void newline(int level) {
    out += '\n';
    for (int k = 0; k < level; ++k) append_bounded(out, *o.indent);
  }

  void string(const std::string& s) {
    std::string quoted;
    json_string(quoted, s, o.ensure_ascii);
    append_bounded(out, quoted);
  }

  void dump(const Value& v, int level) {
    const NestingGuard nest;
    spend_steps();
    if (v.is_none()) {
      out += "null";
    } else if (v.is_bool()) {
      out += v.as_bool() ? "true" : "false";
    } else if (v.is_int()) {
      out += std::to_string(v.as_int());
    } else if (v.is_float()) {
      const double d = v.as_float();
      out += std::isnan(d)   ? "NaN"
             : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                             : float_repr(d);
    } else if (v.is_string()) {
      string(v.as_string());
    } else if (v.is_list()) {
      const auto& items = v.as_list()->items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      if (o.indent) newline(level + 1);
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) {
          append_bounded(out, item_sep);
          if (o.indent) newline(level + 1);
        }
        dump(items[i], level + 1);
      }
      if (o.indent) newline(level);
      out += ']';
    } else if (v.is_dict()) {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.as_dict()->items) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      out += '{';
      if (o.indent) newline(level + 1);
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) {
          append_bounded(out, item_sep);
          if (o.indent) newline(level + 1);
        }
        string(items[i]->first);
        append_bounded(out, key_sep);
        dump(items[i]->second, level + 1);
      }
      if (o.indent) newline(level);
      out += '}';
    } else {
      fail("Object of type " + type_name(v) + " is not JSON serializable");
    }
  }
};

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  Dumper d{options, options.indent ? "," : ", ", ": ", {}};
  if (options.separators) {
    d.item_sep = options.separators->first;
    d.key_sep = options.separators->second;
  }
  d.dump(v, 0);
  return std::move(d.out);
}

// ---- '%' and str.format -----------------------------------------------------------------------

namespace {

// Pads `s` to `width` code points; align '<', '>' or '^'.
std::string pad(const std::string& s, size_t width, char align, char32_t fill = ' ') {
  const size_t n = py::cp_len(s);
  if (n >= width) return s;
  const size_t total = width - n;
  size_t left = align == '<' ? 0 : align == '^' ? total / 2 : total;
  std::string f;
  py::append_utf8(f, fill);
  spend_bytes(s.size() + total * f.size());
  std::string out;
  for (size_t k = 0; k < left; ++k) out += f;
  out += s;
  for (size_t k = 0; k < total - left; ++k) out += f;
  return out;
}

std::string truncate_cps(const std::string& s, int precision) {
  if (precision < 0) return s;
  const std::vector<size_t> offs = py::cp_offsets(s);
  if (static_cast<size_t>(precision) + 1 >= offs.size()) return s;
  return s.substr(0, offs[static_cast<size_t>(precision)]);
}

// A width or precision of a format spec: digits, saturating (spend_bytes refuses what is too
// large before anything is built).
int spec_number(int sofar, char32_t digit) {
  const int d = static_cast<int>(digit - '0');
  return sofar > (INT_MAX - d) / 10 ? INT_MAX : sofar * 10 + d;
}

// snprintf into a string of the size it needs.
template <typename T>
std::string c_format(const std::string& spec, T value) {
  const int n = std::snprintf(nullptr, 0, spec.c_str(), value);
  if (n < 0) fail("cannot format with '" + spec + "'");
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), spec.c_str(), value);
  out.resize(static_cast<size_t>(n));
  return out;
}

// A C-formatted number: `flags` from '-+ #0', conversion one of "dioxXeEfFgG".
std::string c_number(const Value& v, const std::string& flags, int width, int precision,
                     char conv) {
  if (!v.is_number()) {
    if (v.is_undefined()) fail_undefined(v);
    fail(std::string("%") + conv + " format: a real number is required, not " + type_name(v));
  }
  // At most width + precision characters, and the 309 digits of the largest double.
  spend_bytes(static_cast<uint64_t>(std::max(width, 0)) +
              static_cast<uint64_t>(std::max(precision, 0)));
  std::string spec = "%" + flags;
  if (width >= 0) spec += std::to_string(width);
  if (precision >= 0) spec += "." + std::to_string(precision);
  if (conv == 'd' || conv == 'i' || conv == 'o' || conv == 'x' || conv == 'X') {
    long long i = 0;
    if (v.is_float()) {
      const double t = std::trunc(v.as_float());
      if (!(t >= -0x1p63 && t < 0x1p63)) fail("integer overflow (64-bit integers only)");
      i = static_cast<long long>(t);
    } else {
      i = static_cast<long long>(v.integral());
    }
    spec += std::string("ll") + (conv == 'i' ? 'd' : conv);
    return c_format(spec, i);
  }
  spec += conv;
  return c_format(spec, v.number());
}

}  // namespace

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> pos;
  const DictData* mapping = nullptr;
  if (args.is_list() && args.as_list()->tuple) {
    pos = args.as_list()->items;
  } else {
    if (args.is_dict()) mapping = args.as_dict().get();
    pos.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    if (fmt[i] == '%') {
      out += '%';
      continue;
    }
    const Value* arg = nullptr;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) fail("incomplete format key");
      if (!mapping) fail("format requires a mapping");
      arg = mapping->find(fmt.substr(i + 1, close - i - 1));
      if (!arg) fail("KeyError: " + string_repr(fmt.substr(i + 1, close - i - 1)));
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos)
      flags += fmt[i++];
    int width = -1, precision = -1;
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])))
      width = spec_number(std::max(width, 0), static_cast<char32_t>(fmt[i++]));
    if (i < fmt.size() && fmt[i] == '.') {
      precision = 0;
      ++i;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])))
        precision = spec_number(precision, static_cast<char32_t>(fmt[i++]));
    }
    if (i >= fmt.size()) fail("incomplete format");
    const char conv = fmt[i];
    if (!arg) {
      if (next >= pos.size()) fail("not enough arguments for format string");
      arg = &pos[next++];
    }
    if (conv == 's' || conv == 'r' || conv == 'a') {
      const std::string s = truncate_cps(conv == 's' ? to_str(*arg) : repr(*arg), precision);
      append_bounded(out, pad(s, width < 0 ? 0 : static_cast<size_t>(width),
                              flags.find('-') != std::string::npos ? '<' : '>'));
    } else if (std::string("diouxXeEfFgG").find(conv) != std::string::npos) {
      append_bounded(out, c_number(*arg, flags, width, precision, conv == 'u' ? 'd' : conv));
    } else {
      fail(std::string("unsupported format character '") + conv + "'");
    }
  }
  if (!mapping && next < pos.size()) fail("not all arguments converted during string formatting");
  return out;
}

namespace {

std::string format_field(const Value& v, const std::string& spec) {
  if (spec.empty()) return to_str(v);
  size_t i = 0;
  char32_t fill = ' ';
  char align = 0;
  const std::vector<char32_t> cps = py::to_cps(spec);
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (cps.size() >= 2 && is_align(cps[1])) {
    fill = cps[0];
    align = static_cast<char>(cps[1]);
    i = 2;
  } else if (!cps.empty() && is_align(cps[0])) {
    align = static_cast<char>(cps[0]);
    i = 1;
  }
  std::string flags;
  if (i < cps.size() && (cps[i] == '+' || cps[i] == '-' || cps[i] == ' ')) {
    if (cps[i] != '-') flags += static_cast<char>(cps[i]);
    ++i;
  }
  if (i < cps.size() && cps[i] == '0') {
    if (!align) {
      fill = '0';
      align = '=';
    }
    ++i;
  }
  int width = -1, precision = -1;
  while (i < cps.size() && cps[i] >= '0' && cps[i] <= '9')
    width = spec_number(std::max(width, 0), cps[i++]);
  if (i < cps.size() && cps[i] == '.') {
    precision = 0;
    ++i;
    while (i < cps.size() && cps[i] >= '0' && cps[i] <= '9')
      precision = spec_number(precision, cps[i++]);
  }
  char type = 0;
  if (i < cps.size()) type = static_cast<char>(cps[i++]);
  if (i != cps.size()) fail("unsupported format spec '" + spec + "'");
  std::string body;
  if (type == 0 || type == 's') {
    if (type == 's' && !v.is_string()) fail("Unknown format code 's' for " + type_name(v));
    body = (v.is_float() && type == 0 && precision >= 0) ? c_number(v, flags, -1, precision, 'g')
                                                         : truncate_cps(to_str(v), precision);
    if (!align) align = v.is_number() ? '>' : '<';
  } else if (std::string("dxXoeEfFgG%").find(type) != std::string::npos) {
    if (type == '%') {
      if (!v.is_number()) fail("Unknown format code '%' for " + type_name(v));
      body =
          c_number(Value(v.number() * 100.0), flags, -1, precision < 0 ? 6 : precision, 'f') + "%";
    } else {
      body = c_number(v, flags, -1, precision, type);
    }
    if (!align) align = '>';
  } else {
    fail(std::string("unsupported format code '") + type + "'");
  }
  if (width < 0) return body;
  if (align == '=') {  // padding after the sign
    std::string sign;
    if (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) {
      sign = body.substr(0, 1);
      body = body.substr(1);
    }
    return sign + pad(body, static_cast<size_t>(std::max(0, width - static_cast<int>(sign.size()))),
                      '>', fill);
  }
  return pad(body, static_cast<size_t>(width), align, fill);
}

}  // namespace

std::string str_format(const std::string& fmt, const Args& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      fail("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) fail("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    std::string spec;
    char conversion = 0;
    if (const size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      if (bang + 2 != field.size()) fail("invalid conversion in format field");
      conversion = field[bang + 1];
      field = field.substr(0, bang);
    }
    const Value* v = nullptr;
    if (field.empty()) {
      if (auto_index >= args.pos.size())
        fail("Replacement index " + std::to_string(auto_index) + " out of range");
      v = &args.pos[auto_index++];
    } else if (std::all_of(field.begin(), field.end(),
                           [](char d) { return std::isdigit(static_cast<unsigned char>(d)); })) {
      size_t k = 0;
      const auto r = std::from_chars(field.data(), field.data() + field.size(), k);
      if (r.ec != std::errc() || k >= args.pos.size())
        fail("Replacement index " + field + " out of range");
      v = &args.pos[k];
    } else {
      v = args.kwarg(field);
      if (!v) fail("KeyError: " + string_repr(field));
    }
    if (conversion == 'r') {
      append_bounded(out, format_field(Value(repr(*v)), spec));
    } else if (conversion == 's' || conversion == 0) {
      append_bounded(out,
                     conversion ? format_field(Value(to_str(*v)), spec) : format_field(*v, spec));
    } else {
      fail(std::string("Unknown conversion specifier ") + conversion);
    }
  }
  return out;
}

}  // namespace miles::jinja
