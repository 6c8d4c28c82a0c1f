// Incremental decoding, following HF tokenizers' DecodeStream (step_decode_stream).
#include "edgellm/tokenizer.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace edgellm {

namespace {

// The part of `text` after what was already returned (`prefix`). Normally text
// extends prefix. ByteFallback can rewrite earlier output, though: "<0x63>"
// alone is "c", but followed by a dangling lead byte both become U+FFFD. HF
// raises there; a generation loop is better served by the new tail, cut at a
// character boundary so the stream stays valid UTF-8.
std::string tail_after(const std::string& text, const std::string& prefix) {
  if (text.starts_with(prefix)) return text.substr(prefix.size());
  size_t pos = std::min(prefix.size(), text.size());
  while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
  return text.substr(pos);
}

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens,
                             std::vector<std::string> kept_special)
    : tokenizer_(&tokenizer),
      skip_special_(skip_special_tokens),
      kept_special_(std::move(kept_special)) {}

std::string StreamDecoder::push(int32_t id) {
  const Tokenizer::Impl& impl = *tokenizer_->impl_;
  if (prefix_.empty() && !ids_.empty()) {
    std::string p = impl.decode_raw(ids_, skip_special_, false, kept_special_);
    if (!p.ends_with(tok::kReplacementChar)) {
      prefix_ = std::move(p);
      prefix_index_ = ids_.size();
    }
  }
  ids_.push_back(id);
  std::string text = impl.decode_raw(ids_, skip_special_, false, kept_special_);
  // A trailing U+FFFD is usually a character whose remaining bytes are still
  // to come: wait for them.
  if (text.size() <= prefix_.size() || text.ends_with(tok::kReplacementChar)) return {};
  std::string fresh = tail_after(text, prefix_);
  const size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = impl.decode_raw(ids_, skip_special_, false, kept_special_);
  prefix_index_ = new_prefix_index;
  return fresh;
}

std::string StreamDecoder::flush() {
  const Tokenizer::Impl& impl = *tokenizer_->impl_;
  std::string text = impl.decode_raw(ids_, skip_special_, false, kept_special_);
  std::string rest = tail_after(text, prefix_);
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return rest;
}

}  // namespace edgellm
