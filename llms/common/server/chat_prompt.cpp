#include "chat_prompt.h"

#include <algorithm>

#include "edgellm/error.h"
#include "tokenizer/unicode.h"

namespace edgellm {

namespace {

size_t first_char_bytes(const std::string& s) {
  size_t n = 1;
  while (n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) ++n;
  return n;
}

// Each distinct special token met splits the text once at all its occurrences,
// so the depth is bounded by the number of distinct special tokens.
void encode_plain(const Tokenizer& tok, std::string_view text, std::vector<int32_t>& out) {
  if (text.empty()) return;
  const std::vector<int32_t> ids = tok.encode(text);
  const auto special =
      std::find_if(ids.begin(), ids.end(), [&](int32_t id) { return tok.is_special(id); });
  if (special == ids.end()) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  const std::string marker = tok.decode(std::span<const int32_t>(&*special, 1));
  if (marker.empty() || text.find(marker) == std::string_view::npos)
    throw Error("message content holds special-token text that cannot be encoded as plain text");
  size_t begin = 0;
  for (size_t pos = text.find(marker); pos != std::string_view::npos;
       pos = text.find(marker, pos + 1)) {
    const size_t cut = pos + first_char_bytes(marker);
    encode_plain(tok, text.substr(begin, cut - begin), out);
    begin = cut;
  }
  encode_plain(tok, text.substr(begin), out);
}

std::string sentinel(size_t i) {
  return "\x01" + std::to_string(i) + "\x02";
}

std::vector<int32_t> specials_of(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::vector<int32_t> out;
  std::copy_if(ids.begin(), ids.end(), std::back_inserter(out),
               [&](int32_t id) { return tok.is_special(id); });
  return out;
}

}  // namespace

std::vector<int32_t> encode_plain_text(const Tokenizer& tokenizer, std::string_view text) {
  std::vector<int32_t> out;
  encode_plain(tokenizer, text, out);
  return out;
}

std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                 std::span<const ChatMessage> messages) {
  // The template rendered around placeholders tells which text is the
  // template's; the real rendering is then walked part by part.
  std::vector<ChatMessage> placeholders(messages.begin(), messages.end());
  for (size_t i = 0; i < placeholders.size(); ++i) placeholders[i].content = sentinel(i);
  const std::string shape = chat_template.render(placeholders, true);
  const std::string real = chat_template.render(messages, true);

  struct Part {
    std::string text;  // template text, or
    int message = -1;  // the content of messages[message]
  };
  std::vector<Part> parts;
  for (size_t pos = 0; pos < shape.size();) {
    const size_t open = shape.find('\x01', pos);
    if (open != pos) {
      parts.push_back({shape.substr(pos, open - pos), -1});
      if (open == std::string::npos) break;
    }
    const size_t close = shape.find('\x02', open);
    parts.push_back({"", std::stoi(shape.substr(open + 1, close - open - 1))});
    pos = close + 1;
  }

  std::vector<int32_t> template_ids, safe_ids;
  size_t at = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const Part& p = parts[k];
    if (p.message < 0) {
      if (real.compare(at, p.text.size(), p.text) != 0)
        throw Error("chat template: cannot separate the template from the message text");
      const std::vector<int32_t> ids = tokenizer.encode(p.text);
      template_ids.insert(template_ids.end(), ids.begin(), ids.end());
      safe_ids.insert(safe_ids.end(), ids.begin(), ids.end());
      at += p.text.size();
      continue;
    }
    // The template placed the content as is or stripped (Gemma, Llama 3).
    const std::string& content = messages[static_cast<size_t>(p.message)].content;
    const std::string next = k + 1 < parts.size() ? parts[k + 1].text : "";
    std::string placed;
    for (const std::string& c : {content, tok::python_strip(content)}) {
      if (real.compare(at, c.size(), c) == 0 && real.compare(at + c.size(), next.size(), next) == 0)
        placed = c;
      if (!placed.empty() || c.empty()) break;
    }
    encode_plain(tokenizer, placed, safe_ids);
    at += placed.size();
  }
  // Content without special-token text: the plain encoding of the whole text,
  // exactly what HF apply_chat_template(tokenize=True) gives.
  const std::vector<int32_t> whole = tokenizer.encode(real);
  if (specials_of(tokenizer, whole) == specials_of(tokenizer, template_ids)) return whole;
  return safe_ids;
}

}  // namespace edgellm
