// The resource budget of one render (Limits in edgellm/jinja.h): steps, work
// in bytes touched, the live bytes of the values the render holds, and the
// size of any one string. Every check runs before the allocation or the work
// it guards, with saturating arithmetic, and a breach is one LimitError naming
// the limit. The budget of the render running on a thread is reachable from
// anywhere (active_budget()), so that the value functions (equals, to_str,
// dump_json, ...) charge what they do without an Interp at hand; outside a
// render nothing is charged.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "edgellm/jinja.h"
#include "jinja/value.h"

namespace edgellm::jinja {

class Budget {
 public:
  explicit Budget(const Limits& limits) : limits_(limits) {}
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;

  // One evaluated node or loop iteration at template line `line` (the line
  // the other checks name).
  void step(int line);
  // `bytes` read or written by one operation (compare, concatenation, search,
  // case mapping, serialisation, ...).
  void work(size_t bytes);
  // A string (or the rendered text) of `bytes` is about to be made.
  void check_string(size_t bytes) const;
  // `bytes` more live bytes are about to be allocated: refused past the
  // allocation budget (nothing is charged).
  void check_alloc(size_t bytes) const;
  // Live bytes taken by a new value, and given back when it is freed.
  void acquire(size_t bytes);
  // A list or dict nesting `depth` levels is about to be made.
  void check_depth(size_t depth) const;
  void release(size_t bytes) noexcept { live_ -= bytes < live_ ? bytes : live_; }

  int line() const { return line_; }
  size_t live() const { return live_; }
  size_t alloc_left() const { return live_ < limits_.max_memory ? limits_.max_memory - live_ : 0; }

 private:
  [[noreturn]] void refuse(const std::string& what) const;

  const Limits& limits_;
  size_t steps_ = 0;
  size_t work_ = 0;
  size_t live_ = 0;
  int line_ = 0;
};

// The budget of the render running on this thread; null outside a render.
Budget* active_budget();

// Makes `budget` the active one for its lifetime (a render).
class ActiveBudget {
 public:
  explicit ActiveBudget(Budget& budget);
  ~ActiveBudget();
  ActiveBudget(const ActiveBudget&) = delete;
  ActiveBudget& operator=(const ActiveBudget&) = delete;

 private:
  Budget* previous_;
};

// The active budget's checks; each does nothing outside a render.
void charge_work(size_t bytes);
void check_string_size(size_t bytes);
void check_alloc_size(size_t bytes);
void check_depth(size_t depth);
// Counts one level of a recursive walk over a value (a namespace can hold
// itself); refused past Limits::max_depth.
class WalkLevel {
 public:
  WalkLevel();
  ~WalkLevel();
  WalkLevel(const WalkLevel&) = delete;
  WalkLevel& operator=(const WalkLevel&) = delete;
};
// out += piece, refused before it grows `out` past the string limit.
void append_checked(std::string& out, std::string_view piece);
// A string made by an operation whose size is known only once made (bounded
// by its inputs: case mapping, replace, strip): its size checked, its bytes work.
Value checked_string(std::string s);
// How many strings of a split the allocation budget has room for.
size_t parts_allowed();
// A split's parts as a list, refused when there are more than parts_allowed().
Value checked_parts(const std::vector<std::string>& parts);

// What one entry of a linear search (a scope's names, a dict's keys) or one
// item of a walk over a list costs, in bytes of the work budget.
constexpr size_t kLookupBytes = 16;

// Text being built while other work goes on (the output, a macro's or a block's
// text, a concatenation, a list's repr): its bytes count as live while it
// grows, so that buffers nested by macro calls or nested lists cannot together
// outgrow the allocation budget, each within the string limit.
class TextBuffer {
 public:
  TextBuffer();
  ~TextBuffer();
  TextBuffer(const TextBuffer&) = delete;
  TextBuffer& operator=(const TextBuffer&) = delete;
  void append(std::string_view piece);
  // The text, its bytes given back (a Value of it charges them again).
  std::string take();

 private:
  std::string text_;
  Budget* budget_;
  size_t held_ = 0;
};

// Saturating arithmetic for sizes a template chooses (n * m can overflow).
size_t add_sat(size_t a, size_t b);
size_t mul_sat(size_t a, size_t b);
// The work of finding a needle of m bytes in n: the standard library's search
// compares up to m bytes at each of n places.
inline size_t search_cost(size_t n, size_t m) {
  const size_t per_place = m == 0 ? 1 : m < n ? m : n;
  return add_sat(mul_sat(n, per_place), m);
}

// The payloads of Values, charged to the active budget while they live.
std::shared_ptr<const std::string> hold_text(std::string text);
std::shared_ptr<const List> hold_list(List items);
std::shared_ptr<const Dict> hold_dict(Dict dict);

}  // namespace edgellm::jinja
