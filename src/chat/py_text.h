// Python `str` semantics over UTF-8 bytes: code points, whitespace, case, strip/split.
//
// Why: chat templates are Python code in disguise. `len`, slicing, `.strip()`, `.split()`,
// `.upper()` and friends count and classify Unicode code points, not bytes, and "whitespace" means
// Python's `str.isspace()`. Our strings are UTF-8 bytes; these helpers give the Python answer on
// them so that a rendered prompt is byte-for-byte what transformers renders. Invalid UTF-8 never
// aborts: each bad byte counts as one code point, U+FFFD (inputs parsed by nlohmann::json are valid
// UTF-8 anyway).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace miles::py {

// Decodes the code point at `s[i]` and advances `i` past it (one byte for an invalid sequence,
// whose value is then 0xFFFD).
char32_t next_cp(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);
std::vector<char32_t> to_cps(std::string_view s);
std::string from_cps(const std::vector<char32_t>& cps, size_t begin, size_t end);
// Byte offsets of every code point boundary: size() = number of code points + 1.
std::vector<size_t> cp_offsets(std::string_view s);
size_t cp_len(std::string_view s);

bool is_space(char32_t c);      // str.isspace()
bool is_linebreak(char32_t c);  // the boundaries of str.splitlines()
char32_t to_upper(
    char32_t c);  // simple case mapping (ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic)
char32_t to_lower(char32_t c);
bool is_cased(char32_t c);
bool is_alpha(char32_t c);
bool is_digit(char32_t c);

std::string upper(std::string_view s);  // str.upper() (ß becomes SS, as in Python)
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);  // str.capitalize()
std::string title(std::string_view s);       // str.title()

// strip / lstrip / rstrip: `chars` empty-optional means whitespace; otherwise the set of code
// points.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right);
// str.split(sep, maxsplit) / str.rsplit: no sep splits on runs of whitespace and drops empty ends.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit, bool from_right);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
// str.replace(old, new, count) with count < 0 meaning all; an empty `from` inserts between code
// points.
std::string replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);
// str.find / str.rfind as code-point indices, -1 when absent.
int64_t find(std::string_view s, std::string_view sub, bool from_right);
int64_t count(std::string_view s, std::string_view sub);

}  // namespace miles::py
