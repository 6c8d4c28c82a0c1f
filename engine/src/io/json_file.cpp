#include "edgellm/json_file.h"

#include <fstream>
#include <sstream>

#include "edgellm/error.h"

namespace edgellm {

namespace {

struct TooDeep {};

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& source) {
  using nlohmann::json;
  // The callback sees each container as it opens, with the depth of its parent.
  const json::parser_callback_t limit = [](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      throw TooDeep{};
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), limit);
  } catch (const json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line L, column C: why".
    std::string why = e.what();
    if (auto p = why.find(": "); p != std::string::npos) why = why.substr(p + 2);
    throw Error(source + ": parse error at byte " + std::to_string(e.byte) + ": " + why);
  } catch (const json::exception& e) {
    throw Error(source + ": not valid JSON (" + std::string(e.what()) + ")");
  } catch (const TooDeep&) {
    throw Error(source + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                " levels (corrupt file?)");
  }
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot open file");
  std::ostringstream buf;
  buf << in.rdbuf();
  return parse_json(buf.str(), path.string());
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  // Bounded depth makes dump() safe; the cut keeps a 1 MB string out of the message.
  std::string s = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

}  // namespace edgellm
