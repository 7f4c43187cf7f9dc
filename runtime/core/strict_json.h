// JSON parsing that notices a key given twice in one object. The JSON
// grammar allows it and nlohmann::json keeps the last value, so a file that
// says two things ({"loss": "bce", "loss": "softmax"}, or two entries for one
// tensor) would be read one way by us and maybe another by someone else:
// the readers of user files (model specs, safetensors headers, vocab.json)
// refuse such a file, each with its own message.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace pooch {

// Parses `text` as json::parse does (throwing its exceptions, or with
// allow_exceptions false returning a discarded value), and sets *repeated
// to the first key that appears twice in one object ("" where none does).
nlohmann::json parse_json_noting_repeats(std::string_view text, std::string* repeated,
                                         bool allow_exceptions = true);

}  // namespace pooch
