// GPT-2's byte-level alphabet: every byte stands for one printable code point in byte-level
// vocabularies ("Ġ" for a space, "Ċ" for a newline).
//
// Why it matters here: the vocabulary and merges of tokenizer.json and GGUF files are spelled in
// these stand-ins. The readers translate them to raw bytes once, so that encoding works on the
// text's bytes directly and decoding is a table lookup.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace miles::tokenizer {

// The stand-in code point of `byte` (bytes_to_unicode in GPT-2's encoder.py).
uint32_t byte_level_char(uint8_t byte);
// The raw bytes a byte-level token stands for; false (bytes untouched) when one of its code
// points is no stand-in.
bool byte_level_decode(std::string_view token, std::string* bytes);

}  // namespace miles::tokenizer
