// Jinja lexer: template text -> tokens, with jinja2's whitespace control.
//
// Why: most byte differences between a hand-rolled template engine and Python's jinja2 are
// whitespace: `{%-`/`-%}` strip, trim_blocks eats the newline after a block tag, lstrip_blocks eats
// the indentation before one (but never before `{{`), and a single trailing newline of the template
// is dropped. This lexer follows jinja2/lexer.py rule for rule (including its `line_starting`
// subtlety) so that the parser only sees data tokens whose whitespace is already final.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace miles::jinja {

enum class TokType : uint8_t {
  kData,        // literal template text
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifiers and keywords (and, or, not, in, is, if, else, true, none, ...)
  kString,      // unescaped string literal
  kInt,
  kFloat,
  kOp,  // + - * / // % ** ~ == != < <= > >= = . , : | ( ) [ ] { } ;
  kEof,
};

struct Token {
  TokType type;
  int line;          // 1-based line of the token's first character
  std::string text;  // data, name, operator, or the string literal's value
  int64_t int_value = 0;
  double float_value = 0;
};

struct LexOptions {
  bool trim_blocks = true;  // transformers' chat template environment sets both
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws TemplateError (with the line) on malformed input: unclosed tags, comments or raw blocks,
// unbalanced brackets, characters that start no token.
std::vector<Token> lex(std::string_view source, const LexOptions& options);

}  // namespace miles::jinja
