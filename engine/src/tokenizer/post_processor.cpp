#include "post_processor.h"

namespace edgellm::tok {

namespace {

// A later processor in a Sequence wraps the output of the earlier ones.
void wrap(PostProcessor& out, std::vector<int32_t> prefix, const std::vector<int32_t>& suffix) {
  prefix.insert(prefix.end(), out.prefix.begin(), out.prefix.end());
  out.prefix = std::move(prefix);
  out.suffix.insert(out.suffix.end(), suffix.begin(), suffix.end());
}

void append_processor(const json& j, const std::string& where, PostProcessor& out) {
  if (j.is_null()) return;
  const std::string type = type_field(j, where);
  if (type == "Sequence") {
    const json& list = require_field(j, "processors", where);
    if (!list.is_array()) fail(at_key(where, "processors"), "expected a list");
    for (size_t i = 0; i < list.size(); ++i)
      append_processor(list[i], at_index(at_key(where, "processors"), i), out);
    return;
  }
  if (type == "ByteLevel") return;  // only adjusts offsets, which we do not produce
  if (type == "TemplateProcessing") {
    const std::string sw = at_key(where, "single");
    const json& single = require_field(j, "single", where);
    if (!single.is_array()) fail(sw, "expected a list");
    const json& specials = require_field(j, "special_tokens", where);
    std::vector<int32_t> prefix, suffix;
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string pw = at_index(sw, i);
      if (find_field(single[i], "Sequence")) {
        seen_sequence = true;
        continue;
      }
      const json& st = require_field(single[i], "SpecialToken", pw);
      const std::string name = string_field(st, "id", at_key(pw, "SpecialToken"));
      const std::string tw = at_key(at_key(where, "special_tokens"), name);
      const json& entry = require_field(specials, name, at_key(where, "special_tokens"));
      const json& ids = require_field(entry, "ids", tw);
      if (!ids.is_array()) fail(at_key(tw, "ids"), "expected a list");
      for (size_t k = 0; k < ids.size(); ++k)
        (seen_sequence ? suffix : prefix).push_back(as_id(ids[k], at_index(at_key(tw, "ids"), k)));
    }
    wrap(out, std::move(prefix), suffix);
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    // [cls] A [sep]; both are [token, id] pairs.
    auto pair_id = [&](const char* key) {
      const json& p = require_field(j, key, where);
      if (!p.is_array() || p.size() != 2) fail(at_key(where, key), "expected [token, id]");
      return as_id(p[1], at_index(at_key(where, key), 1));
    };
    wrap(out, {pair_id("cls")}, {pair_id("sep")});
    return;
  }
  fail(at_key(where, "type"), "post-processor '" + type + "' is not supported");
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& where) {
  auto p = std::make_unique<PostProcessor>();
  append_processor(j, where, *p);
  if (p->prefix.empty() && p->suffix.empty()) return nullptr;
  return p;
}

}  // namespace edgellm::tok
