// Chat messages to prompt tokens, so that user text can never forge a turn:
// the chat template's own markers are special tokens, while every message's
// content is encoded as plain text (a special-token string typed by a user,
// such as "<|im_end|>", becomes ordinary text tokens).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "edgellm/tokenizer.h"

namespace edgellm {

// Encodes `text` so that no special token of the tokenizer appears in it as a
// control token: where the normal encoding matched one, the text is cut
// inside the marker and the parts are encoded separately.
std::vector<int32_t> encode_plain_text(const Tokenizer& tokenizer, std::string_view text);

// The template rendered with add_generation_prompt, the template's text encoded
// with its special tokens and each message's content with encode_plain_text.
std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                 std::span<const ChatMessage> messages);

}  // namespace edgellm
