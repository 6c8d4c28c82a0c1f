// A byte-level matcher for a compiled JSON grammar: its state is the set of
// parse stacks (alternatives of anyOf, enum values and optional properties
// stay open until the bytes tell them apart) that the bytes so far allow.
// Copyable; the token mask (token_mask.cpp) advances copies of it along a
// trie of the vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "runtime/json_grammar_nodes.h"

namespace edgellm {

// One level of a parse stack. 16 bytes, no padding: stacks compare with memcmp.
struct MatchFrame {
  uint8_t kind = 0;   // FrameKind (json_matcher.cpp)
  uint8_t state = 0;  // the position inside the frame's value
  uint8_t aux = 0;    // digits of a number part, bytes left of a UTF-8 character, hex digits
  uint8_t flag = 0;   // a space allowed / an integer / a surrogate escape begun
  int32_t node = -1;  // the grammar node
  int32_t a = 0;      // next property, items so far, code points so far, literal position
  int32_t b = 0;      // a UTF-8 character's next byte range (lo | hi << 8)
};

// Every parse stack still alive, concatenated.
struct MatchState {
  std::vector<MatchFrame> frames;
  std::vector<uint32_t> ends;  // stack i is frames[ends[i-1], ends[i])
  size_t stacks() const { return ends.size(); }
  bool dead() const { return ends.empty(); }
  void clear() {
    frames.clear();
    ends.clear();
  }
};

class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const JsonGrammar> grammar);

  const MatchState& state() const { return state_; }
  // Feeds bytes to the current state; false (state unchanged) when they leave the grammar.
  bool accept(std::string_view bytes);
  // out = `in` after byte c (dead when c is not allowed there).
  void step(const MatchState& in, uint8_t c, MatchState& out);
  // The document is complete: it may end here.
  bool complete() const;
  // Complete and nothing may follow.
  bool ended() const;
  // Inside a string, between characters: how many more code points it may
  // take (INT32_MAX when unbounded), else -1. There, every byte but '"', '\\'
  // and the control bytes adds one (the token mask's fast path).
  int32_t string_room() const;

 private:
  void step_stack(std::vector<MatchFrame>& s, uint8_t c, MatchState& out, size_t level);
  void push(const std::vector<MatchFrame>& s, MatchState& out) const;

  std::shared_ptr<const JsonGrammar> grammar_;
  const std::vector<GrammarNode>* nodes_;
  MatchState state_;
  MatchState next_;
  std::vector<std::vector<MatchFrame>> scratch_;  // one stack copy per recursion level
};

}  // namespace edgellm
