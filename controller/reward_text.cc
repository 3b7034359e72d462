// Text helpers of the built-in verifiers: trimming, ASCII case folding, the answer after a prefix,
// the last number of a response, and a numeric label.
//
// Why: "the answer is 1,234." and "#### -3.5" are how models write numbers; one scanner that the
// numeric verifier (and its tests) share decides what counts as one.
#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

#include "controller/reward_internal.h"

namespace miles::reward {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }
bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// Parses a plain decimal ("-12.5", "3", ".5"); the whole of `s` must be the number.
std::optional<double> parse_decimal(std::string_view s) {
  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value, std::chars_format::fixed);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

}  // namespace

std::string_view trim(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

std::string to_lower_ascii(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<std::string_view> after_last(std::string_view text, std::string_view prefix) {
  size_t pos = text.rfind(prefix);
  if (pos == std::string_view::npos) return std::nullopt;
  return text.substr(pos + prefix.size());
}

std::optional<double> last_number(std::string_view text) {
  std::optional<double> last;
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    bool starts = is_digit(text[i]) || (text[i] == '.' && i + 1 < n && is_digit(text[i + 1]) &&
                                        (i == 0 || !is_digit(text[i - 1])));
    if (!starts) {
      ++i;
      continue;
    }
    bool negative = i > 0 && text[i - 1] == '-' && (i < 2 || !is_alnum(text[i - 2]));
    std::string digits = negative ? "-" : "";
    size_t j = i;
    while (j < n && is_digit(text[j])) digits += text[j++];
    // Thousands groups: 1-3 leading digits, then ",ddd" groups not followed by another digit.
    size_t int_len = j - i;
    if (int_len >= 1 && int_len <= 3) {
      while (j + 3 < n && text[j] == ',' && is_digit(text[j + 1]) && is_digit(text[j + 2]) &&
             is_digit(text[j + 3]) && (j + 4 == n || !is_digit(text[j + 4]))) {
        digits.append(text.substr(j + 1, 3));
        j += 4;
      }
    }
    if (j + 1 < n && text[j] == '.' && is_digit(text[j + 1])) {
      digits += text[j++];
      while (j < n && is_digit(text[j])) digits += text[j++];
    }
    if (auto v = parse_decimal(digits)) last = *v;
    i = j;
  }
  return last;
}

Result<double> number_label(const nlohmann::json& label) {
  if (label.is_number()) return label.get<double>();
  if (label.is_string()) {
    std::string cleaned;
    for (char c : trim(label.get_ref<const std::string&>())) {
      if (c != ',') cleaned += c;
    }
    std::string_view s = cleaned;
    if (!s.empty() && s.front() == '+') s.remove_prefix(1);
    if (auto v = parse_decimal(s)) return *v;
    return Status::Error("label '" + excerpt(label.get_ref<const std::string&>()) +
                         "' is not a number");
  }
  if (label.is_null()) return Status::Error("the sample has no label (a number is needed)");
  return Status::Error(std::string("label must be a number or a numeric string, got ") +
                       label.type_name());
}

}  // namespace miles::reward
