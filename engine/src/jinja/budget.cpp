#include "jinja/budget.h"

#include <algorithm>
#include <limits>

namespace edgellm::jinja {

namespace {

thread_local Budget* g_active = nullptr;

// What a heap block costs beyond its payload (allocator header, shared_ptr's
// control block): charged with every value so that many tiny values count.
constexpr size_t kBlockOverhead = 64;

}  // namespace

size_t add_sat(size_t a, size_t b) {
  size_t r;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<size_t>::max() : r;
}

size_t mul_sat(size_t a, size_t b) {
  size_t r;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<size_t>::max() : r;
}

void Budget::refuse(const std::string& what) const {
  throw LimitError(what, line_);
}

void Budget::step(int line) {
  line_ = line;
  if (++steps_ > limits_.max_steps)
    refuse("the render exceeds the " + std::to_string(limits_.max_steps) + "-step work budget");
}

void Budget::work(size_t bytes) {
  work_ = add_sat(work_, bytes);
  if (work_ > limits_.max_work)
    refuse("the render exceeds the " + std::to_string(limits_.max_work) +
           "-byte work budget (bytes compared, copied or searched)");
}

void Budget::check_string(size_t bytes) const {
  if (bytes > limits_.max_output)
    refuse("the output or a string would exceed the " + std::to_string(limits_.max_output) +
           "-byte output budget");
}

void Budget::check_alloc(size_t bytes) const {
  if (add_sat(live_, bytes) > limits_.max_memory)
    refuse("the render exceeds the " + std::to_string(limits_.max_memory) +
           "-byte allocation budget (live strings, lists, dicts and scopes)");
}

void Budget::check_depth(size_t depth) const {
  if (depth > static_cast<size_t>(limits_.max_depth))
    refuse("a value nests more than " + std::to_string(limits_.max_depth) + " levels deep");
}

void Budget::acquire(size_t bytes) {
  check_alloc(bytes);
  live_ += bytes;
}

Budget* active_budget() {
  return g_active;
}

ActiveBudget::ActiveBudget(Budget& budget) : previous_(g_active) {
  g_active = &budget;
}
ActiveBudget::~ActiveBudget() {
  g_active = previous_;
}

void charge_work(size_t bytes) {
  if (g_active) g_active->work(bytes);
}
void check_string_size(size_t bytes) {
  if (g_active) g_active->check_string(bytes);
}
void check_alloc_size(size_t bytes) {
  if (g_active) g_active->check_alloc(bytes);
}
void check_depth(size_t depth) {
  if (g_active) g_active->check_depth(depth);
}

namespace {
thread_local size_t g_walk_level = 0;
}

WalkLevel::WalkLevel() {
  ++g_walk_level;
  try {
    check_depth(g_walk_level);
  } catch (...) {
    --g_walk_level;
    throw;
  }
}
WalkLevel::~WalkLevel() {
  --g_walk_level;
}

void append_checked(std::string& out, std::string_view piece) {
  if (g_active) {
    const size_t n = add_sat(out.size(), piece.size());
    g_active->check_string(n);
    // Growing past the capacity copies what is there (and doubles the block).
    g_active->work(n > out.capacity() ? add_sat(n, piece.size()) : piece.size());
  }
  out += piece;
}

TextBuffer::TextBuffer() : budget_(g_active) {}

TextBuffer::~TextBuffer() {
  if (budget_) budget_->release(held_);
}

void TextBuffer::append(std::string_view piece) {
  if (budget_) {
    const size_t n = add_sat(text_.size(), piece.size());
    budget_->check_string(n);
    // Growing past the capacity doubles the block: the new capacity is held.
    const size_t capacity = n > text_.capacity() ? std::max(n, 2 * text_.capacity()) : 0;
    if (capacity) {
      budget_->acquire(capacity - held_);
      held_ = capacity;
    }
    budget_->work(capacity ? add_sat(n, piece.size()) : piece.size());
  }
  text_ += piece;
}

std::string TextBuffer::take() {
  if (budget_) budget_->release(held_);
  held_ = 0;
  return std::move(text_);
}

namespace {

// What one part of a split costs: its Value, its string and their blocks.
constexpr size_t kPartBytes = sizeof(Value) + sizeof(std::string) + kBlockOverhead;

}  // namespace

Value checked_string(std::string s) {
  check_string_size(s.size());
  charge_work(s.size());
  return Value::string(std::move(s));
}

size_t parts_allowed() {
  return g_active ? g_active->alloc_left() / kPartBytes : SIZE_MAX;
}

Value checked_parts(const std::vector<std::string>& parts) {
  check_alloc_size(mul_sat(parts.size(), kPartBytes));
  List out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.push_back(Value::string(p));
  return Value::make_list(std::move(out));
}

namespace {

// A payload charged `bytes` to `budget` until its last Value goes.
template <class T>
std::shared_ptr<const T> hold(T payload, size_t bytes) {
  Budget* budget = g_active;
  if (!budget) return std::make_shared<const T>(std::move(payload));
  budget->acquire(bytes);
  try {
    return std::shared_ptr<const T>(new T(std::move(payload)), [budget, bytes](const T* p) {
      budget->release(bytes);
      delete p;
    });
  } catch (...) {
    budget->release(bytes);
    throw;
  }
}

}  // namespace

std::shared_ptr<const std::string> hold_text(std::string text) {
  const size_t bytes = add_sat(text.capacity(), kBlockOverhead);
  return hold(std::move(text), bytes);
}

std::shared_ptr<const List> hold_list(List items) {
  const size_t bytes = add_sat(mul_sat(items.capacity(), sizeof(Value)), kBlockOverhead);
  return hold(std::move(items), bytes);
}

std::shared_ptr<const Dict> hold_dict(Dict dict) {
  const size_t bytes =
      add_sat(mul_sat(dict.items.capacity(), sizeof(std::pair<Value, Value>)), kBlockOverhead);
  return hold(std::move(dict), bytes);
}

}  // namespace edgellm::jinja
