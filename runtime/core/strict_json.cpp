#include "strict_json.h"

#include <set>
#include <vector>

namespace pooch {

nlohmann::json parse_json_noting_repeats(std::string_view text, std::string* repeated,
                                         bool allow_exceptions) {
  using json = nlohmann::json;
  repeated->clear();
  std::vector<std::set<std::string>> keys;  // of each object being parsed
  const json::parser_callback_t note_keys = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (ev == json::parse_event_t::key && !keys.empty() && parsed.is_string() &&
               !keys.back().insert(parsed.get<std::string>()).second && repeated->empty()) {
      *repeated = parsed.get<std::string>();
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), note_keys, allow_exceptions);
}

}  // namespace pooch
