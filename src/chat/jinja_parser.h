// Jinja parser: tokens -> statement tree, following jinja2/parser.py's grammar and precedence.
//
// Why: the precedence of Jinja's operators differs from Python's in places (`~` binds tighter than
// `+`, a filter binds to the unary expression before it, `not x is y` is `not (x is y)`), and a
// template only renders the same if it parses the same; the recursive descent below is a
// function-for-function port of jinja2's. Unknown tags, filters and tests are refused here, with
// the line, so a template we cannot render fails when it is loaded.
#pragma once

#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"

namespace miles::jinja {

// Throws TemplateError (with the line) on a syntax error or an unsupported construct.
Body parse(const std::vector<Token>& tokens);

}  // namespace miles::jinja
