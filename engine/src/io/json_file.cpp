#include "edgellm/json_file.h"

#include <fstream>
#include <sstream>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "edgellm/error.h"

namespace edgellm {

namespace {

// nlohmann's own DOM builder, with two bounds: nesting (kMaxJsonDepth, checked
// as each container opens) and time. nlohmann's ordered_json finds a key by a
// linear search on every insertion, so one object of n keys took O(n^2) to
// parse (100,000 keys in a 1 MB request body: 30 s of CPU); here each open
// object of an ordered_json keeps a hash index of its keys.
template <typename J>
class BoundedBuilder : public nlohmann::json_sax<J> {
  using Base = nlohmann::json_sax<J>;
  static constexpr bool kOrdered = std::is_same_v<J, nlohmann::ordered_json>;

 public:
  J root;
  bool too_deep = false;
  size_t error_byte = 0;
  std::string error;  // the parser's message, when it stopped at an error

  bool null() override { return put(nullptr); }
  bool boolean(bool v) override { return put(v); }
  bool number_integer(typename Base::number_integer_t v) override { return put(v); }
  bool number_unsigned(typename Base::number_unsigned_t v) override { return put(v); }
  bool number_float(typename Base::number_float_t v, const typename Base::string_t&) override {
    return put(v);
  }
  bool string(typename Base::string_t& v) override { return put(std::move(v)); }
  bool binary(typename Base::binary_t& v) override { return put(J::binary(std::move(v))); }
  bool start_object(size_t) override { return open(J::object()); }
  bool start_array(size_t) override { return open(J::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  // A repeated key keeps its first place and takes the last value, as nlohmann's parsers do.
  bool key(typename Base::string_t& k) override {
    Level& level = open_.back();
    auto& object = level.value->template get_ref<typename J::object_t&>();
    if constexpr (kOrdered) {
      const auto [at, added] = level.index.try_emplace(k, object.size());
      auto& entries = static_cast<typename J::object_t::Container&>(object);
      if (added) entries.emplace_back(k, nullptr);
      slot_ = &entries[at->second].second;
    } else {
      slot_ = &object[k];
    }
    return true;
  }

  bool parse_error(size_t byte, const std::string&, const nlohmann::detail::exception& e) override {
    error_byte = byte;
    // e.what() is "[json.exception.parse_error.101] parse error at line L, column C: why".
    error = e.what();
    if (const auto p = error.find(": "); p != std::string::npos) error = error.substr(p + 2);
    return false;
  }

 private:
  struct Level {
    J* value;
    std::unordered_map<std::string, size_t> index;  // ordered_json: key -> its place
  };

  // Where a value goes: the root, the end of the open array, or the slot of the last key.
  J* place(J&& v) {
    if (open_.empty()) {
      root = std::move(v);
      return &root;
    }
    J& parent = *open_.back().value;
    if (parent.is_array()) {
      auto& array = parent.template get_ref<typename J::array_t&>();
      array.push_back(std::move(v));
      return &array.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  bool put(J&& v) {
    place(std::move(v));
    return true;
  }
  bool open(J&& container) {
    if (open_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      too_deep = true;
      return false;
    }
    open_.push_back({place(std::move(container)), {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  std::vector<Level> open_;  // the containers open, outermost first
  J* slot_ = nullptr;
};

template <typename J>
J parse_bounded(std::string_view text, const std::string& source) {
  BoundedBuilder<J> builder;
  bool parsed = false;
  try {
    parsed = J::sax_parse(text.begin(), text.end(), &builder);
  } catch (const typename J::exception& e) {
    throw Error(source + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (builder.too_deep)
    throw Error(source + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                " levels (corrupt file?)");
  if (!parsed)
    throw Error(source + ": parse error at byte " + std::to_string(builder.error_byte) + ": " +
                builder.error);
  return std::move(builder.root);
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& source) {
  return parse_bounded<nlohmann::json>(text, source);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& source) {
  return parse_bounded<nlohmann::ordered_json>(text, source);
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
