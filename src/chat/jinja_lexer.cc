// Jinja lexer (see jinja_lexer.h). Mirrors jinja2/lexer.py: the root rule finds the next `{{`,
// `{%`,
// `{#` (or `{% raw %}`), applies OptionalLStrip to the text before it, then a tag is tokenized
// until its end delimiter, which is recognised only when brackets are balanced.
#include "chat/jinja_lexer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <string>

#include "chat/jinja_value.h"
#include "chat/py_text.h"

namespace miles::jinja {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Newlines normalised to "\n", one trailing newline dropped (jinja2's keep_trailing_newline=False).
std::string normalize_source(std::string_view src, bool keep_trailing_newline) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Python's `str.rstrip()` (Unicode whitespace).
std::string rstrip_space(std::string_view s) { return py::strip(s, std::nullopt, false, true); }

bool all_space(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();)
    if (!py::is_space(py::next_cp(s, i))) return false;
  return true;
}

// Python string-literal unescaping (jinja2 decodes literals with "unicode-escape").
std::string unescape(std::string_view s, int line) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    switch (c) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        if (i + n >= s.size())
          fail("truncated \\" + std::string(1, c) + " escape in string literal", line);
        uint32_t cp = 0;
        for (size_t k = 1; k <= n; ++k) {
          const char h = s[i + k];
          const int d = is_digit(h)              ? h - '0'
                        : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                        : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                 : -1;
          if (d < 0) fail("invalid \\" + std::string(1, c) + " escape in string literal", line);
          cp = cp * 16 + static_cast<uint32_t>(d);
        }
        if (cp > 0x10FFFF) fail("illegal Unicode character in string literal", line);
        py::append_utf8(out, cp);
        i += n;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          uint32_t cp = 0;
          size_t k = 0;
          while (k < 3 && i + k < s.size() && s[i + k] >= '0' && s[i + k] <= '7')
            cp = cp * 8 + static_cast<uint32_t>(s[i + k++] - '0');
          py::append_utf8(out, cp);
          i += k - 1;
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string src, const LexOptions& o) : s_(std::move(src)), o_(o) {
    for (size_t i = 0; i < s_.size(); ++i)
      if (s_[i] == '\n') newlines_.push_back(i);
  }

  std::vector<Token> run() {
    while (pos_ < s_.size()) root_step();
    toks_.push_back(Token{TokType::kEof, line_at(s_.size()), {}});
    return std::move(toks_);
  }

 private:
  int line_at(size_t pos) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), pos) -
                                newlines_.begin());
  }
  bool at(size_t p, std::string_view lit) const { return s_.compare(p, lit.size(), lit) == 0; }
  size_t skip_space(size_t p) const {
    while (p < s_.size()) {
      size_t q = p;
      if (!py::is_space(py::next_cp(s_, q))) break;
      p = q;
    }
    return p;
  }
  void emit(TokType t, size_t pos, std::string text) {
    toks_.push_back(Token{t, line_at(pos), std::move(text)});
  }

  // OptionalLStrip: the data before a tag, stripped per the tag's sign and lstrip_blocks.
  void emit_data_before_tag(size_t begin, size_t end, char sign, bool is_variable) {
    std::string text = s_.substr(begin, end - begin);
    if (sign == '-') {
      text = rstrip_space(text);
    } else if (sign != '+' && o_.lstrip_blocks && !is_variable) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && all_space(std::string_view(text).substr(l_pos)))
        text.resize(l_pos);
    }
    if (!text.empty()) emit(TokType::kData, begin, std::move(text));
  }

  // Matches `\s*raw\s*(-%}\s*|%})` at p (after `{%` and its sign); returns the end or npos.
  size_t match_raw_begin(size_t p) const {
    p = skip_space(p);
    if (!at(p, "raw")) return std::string::npos;
    p = skip_space(p + 3);
    if (at(p, "-%}")) return skip_space(p + 3);
    if (at(p, "%}")) return p + 2;
    return std::string::npos;
  }

  void root_step() {
    size_t t = pos_;
    for (;;) {
      t = s_.find('{', t);
      if (t == std::string::npos || t + 1 >= s_.size()) {
        emit(TokType::kData, pos_, s_.substr(pos_));  // the rest is data
        pos_ = s_.size();
        return;
      }
      const char k = s_[t + 1];
      if (k == '{' || k == '%' || k == '#') break;
      ++t;
    }
    const char kind = s_[t + 1];
    size_t after = t + 2;
    char sign = 0;
    if (after < s_.size() && (s_[after] == '-' || s_[after] == '+')) sign = s_[after++];
    if (kind == '%') {
      if (const size_t raw_end = match_raw_begin(after); raw_end != std::string::npos) {
        emit_data_before_tag(pos_, t, sign, false);
        line_starting_ = s_[raw_end - 1] == '\n';
        lex_raw(t, raw_end);
        return;
      }
    }
    emit_data_before_tag(pos_, t, sign, kind == '{');
    line_starting_ = false;
    pos_ = after;
    if (kind == '#') {
      lex_comment(t);
    } else {
      lex_tag(t, kind == '{');
    }
  }

  void finish_block_end(size_t p) {  // p just after "%}" (no sign)
    if (o_.trim_blocks && p < s_.size() && s_[p] == '\n') ++p;
    pos_ = p;
    line_starting_ = s_[p - 1] == '\n';
  }

  void lex_comment(size_t open) {
    const size_t q = s_.find("#}", pos_);
    if (q == std::string::npos) fail("missing end of comment tag '#}'", line_at(open));
    if (q > pos_ && s_[q - 1] == '-') {
      pos_ = skip_space(q + 2);
      line_starting_ = s_[pos_ - 1] == '\n';
    } else if (q > pos_ && s_[q - 1] == '+') {
      pos_ = q + 2;
      line_starting_ = false;
    } else {
      finish_block_end(q + 2);
    }
  }

  // `{% raw %}`: everything up to `{%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)` is data.
  void lex_raw(size_t open, size_t body) {
    for (size_t q = s_.find("{%", body); q != std::string::npos; q = s_.find("{%", q + 1)) {
      size_t p = q + 2;
      char sign = 0;
      if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) sign = s_[p++];
      p = skip_space(p);
      if (!at(p, "endraw")) continue;
      p = skip_space(p + 6);
      size_t end;
      if (at(p, "+%}")) {
        end = p + 3;
      } else if (at(p, "-%}")) {
        end = skip_space(p + 3);
      } else if (at(p, "%}")) {
        end = p + 2;
        if (o_.trim_blocks && end < s_.size() && s_[end] == '\n') ++end;
      } else {
        continue;
      }
      emit_data_before_tag(body, q, sign, false);
      pos_ = end;
      line_starting_ = s_[end - 1] == '\n';
      return;
    }
    fail("missing end of raw directive ('{% endraw %}')", line_at(open));
  }

  // Tries the tag's end delimiter at pos_ (only called with balanced brackets).
  bool try_tag_end(bool variable) {
    if (variable) {
      if (at(pos_, "-}}")) {
        pos_ = skip_space(pos_ + 3);
      } else if (at(pos_, "}}")) {
        pos_ += 2;
      } else {
        return false;
      }
      line_starting_ = s_[pos_ - 1] == '\n';
      return true;
    }
    if (at(pos_, "+%}")) {
      pos_ += 3;
      line_starting_ = false;
    } else if (at(pos_, "-%}")) {
      pos_ = skip_space(pos_ + 3);
      line_starting_ = s_[pos_ - 1] == '\n';
    } else if (at(pos_, "%}")) {
      finish_block_end(pos_ + 2);
    } else {
      return false;
    }
    return true;
  }

  void lex_tag(size_t open, bool variable) {
    emit(variable ? TokType::kVarBegin : TokType::kBlockBegin, open, variable ? "{{" : "{%");
    std::vector<char> balance;
    for (;;) {
      if (pos_ >= s_.size())
        fail(std::string("unexpected end of template: unclosed '") + (variable ? "{{" : "{%") +
                 "' (missing '" + (variable ? "}}" : "%}") + "')",
             line_at(open));
      if (balance.empty() && try_tag_end(variable)) {
        const size_t end = pos_;
        emit(variable ? TokType::kVarEnd : TokType::kBlockEnd, end - 1, variable ? "}}" : "%}");
        return;
      }
      lex_token(balance);
    }
  }

  // (\d+_)*\d+ at p: the end, or p when there is no digit.
  size_t match_digits(size_t p) const {
    if (p >= s_.size() || !is_digit(s_[p])) return p;
    while (p < s_.size() && is_digit(s_[p])) ++p;
    while (p + 1 < s_.size() && s_[p] == '_' && is_digit(s_[p + 1])) {
      ++p;
      while (p < s_.size() && is_digit(s_[p])) ++p;
    }
    return p;
  }

  size_t match_float(size_t p) const {
    if (p > 0 && s_[p - 1] == '.') return p;
    const size_t int_end = match_digits(p);
    if (int_end == p) return p;
    size_t q = int_end;
    bool frac = false;
    if (q + 1 < s_.size() && s_[q] == '.' && is_digit(s_[q + 1])) {
      q = match_digits(q + 1);
      frac = true;
    }
    if (q < s_.size() && (s_[q] == 'e' || s_[q] == 'E')) {
      size_t e = q + 1;
      if (e < s_.size() && (s_[e] == '+' || s_[e] == '-')) ++e;
      const size_t e_end = match_digits(e);
      if (e_end != e) return e_end;
    }
    return frac ? q : p;
  }

  static std::string without_underscores(std::string_view s) {
    std::string out;
    for (char c : s)
      if (c != '_') out += c;
    return out;
  }

  void lex_token(std::vector<char>& balance) {
    const size_t start = pos_;
    size_t q = pos_;
    if (py::is_space(py::next_cp(s_, q))) {
      pos_ = skip_space(pos_);
      line_starting_ = s_[pos_ - 1] == '\n';
      return;
    }
    line_starting_ = false;
    const char c = s_[pos_];
    if (const size_t f = match_float(pos_); f != pos_) {
      Token t{TokType::kFloat, line_at(start), s_.substr(start, f - start)};
      t.float_value = std::strtod(without_underscores(t.text).c_str(), nullptr);
      toks_.push_back(std::move(t));
      pos_ = f;
      return;
    }
    if (is_digit(c)) {
      lex_integer();
      return;
    }
    if (is_name_start(c)) {
      size_t e = pos_;
      while (e < s_.size() && is_name_char(s_[e])) ++e;
      emit(TokType::kName, start, s_.substr(start, e - start));
      pos_ = e;
      return;
    }
    if (c == '\'' || c == '"') {
      size_t e = pos_ + 1;
      while (e < s_.size() && s_[e] != c) e += (s_[e] == '\\') ? 2 : 1;
      if (e >= s_.size())
        fail(std::string("unterminated string literal starting with ") + c, line_at(start));
      const int line = line_at(start);
      toks_.push_back(
          Token{TokType::kString, line, unescape(s_.substr(start + 1, e - start - 1), line)});
      pos_ = e + 1;
      return;
    }
    static const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (at(pos_, op)) {
        emit(TokType::kOp, start, op);
        pos_ += 2;
        return;
      }
    }
    if (std::string_view("+-/*%~[](){}=.:|,;<>").find(c) == std::string_view::npos)
      fail(std::string("unexpected char '") + c + "'", line_at(start));
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) fail(std::string("unexpected '") + c + "'", line_at(start));
      if (balance.back() != c)
        fail(std::string("unexpected '") + c + "', expected '" + balance.back() + "'",
             line_at(start));
      balance.pop_back();
    }
    emit(TokType::kOp, start, std::string(1, c));
    ++pos_;
  }

  void lex_integer() {
    const size_t start = pos_;
    int base = 10;
    size_t p = pos_;
    if (s_[p] == '0' && p + 1 < s_.size() &&
        std::string_view("bBoOxX").find(s_[p + 1]) != std::string_view::npos) {
      const char b = static_cast<char>(s_[p + 1] | 0x20);
      base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
      auto ok = [&](char d) {
        if (base == 2) return d == '0' || d == '1';
        if (base == 8) return d >= '0' && d <= '7';
        return is_digit(d) || ((d | 0x20) >= 'a' && (d | 0x20) <= 'f');
      };
      size_t q = p + 2;
      while (q < s_.size()) {
        if (s_[q] == '_' && q + 1 < s_.size() && ok(s_[q + 1])) {
          q += 2;
        } else if (ok(s_[q])) {
          ++q;
        } else {
          break;
        }
      }
      if (q == p + 2) {  // "0x" without digits: "0" then a name
        p = p + 1;
        base = 10;
      } else {
        p = q;
      }
    } else if (s_[p] == '0') {
      ++p;
      while (p + 1 < s_.size() && ((s_[p] == '_' && s_[p + 1] == '0') || s_[p] == '0'))
        p += s_[p] == '_' ? 2 : 1;
    } else {
      p = match_digits(p);
    }
    std::string digits = without_underscores(s_.substr(start, p - start));
    if (base != 10) digits = digits.substr(2);
    errno = 0;
    Token t{TokType::kInt, line_at(start), s_.substr(start, p - start)};
    char* end = nullptr;
    t.int_value = std::strtoll(digits.c_str(), &end, base);
    if (errno == ERANGE) fail("integer literal " + t.text + " is too large (64-bit only)", t.line);
    toks_.push_back(std::move(t));
    pos_ = p;
  }

  std::string s_;
  const LexOptions& o_;
  std::vector<size_t> newlines_;
  std::vector<Token> toks_;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

}  // namespace

std::vector<Token> lex(std::string_view source, const LexOptions& options) {
  return Lexer(normalize_source(source, options.keep_trailing_newline), options).run();
}

}  // namespace miles::jinja
