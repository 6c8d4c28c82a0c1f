// The serving part of the binding (see serving.cpp).
#pragma once

#include <nanobind/nanobind.h>

#include <memory>
#include <optional>
#include <tuple>

#include "edgellm/generate.h"
#include "edgellm/json_grammar.h"

// A compiled response_format / JSON schema as Python holds it (the grammar
// itself is an incomplete type): passed as `grammar=` to generate(),
// generate_timed() and Scheduler.submit().
struct PyGrammar {
  std::shared_ptr<const edgellm::JsonGrammar> grammar;
};

// chat_reasoning()'s rules as Python holds them: (enabled, started, budget, harmony).
using PyReasoning = std::tuple<bool, bool, int, bool>;
inline edgellm::GenerateOptions::Reasoning reasoning_of(const std::optional<PyReasoning>& r) {
  if (!r) return {};
  const auto [enabled, started, budget, harmony] = *r;
  return {.enabled = enabled, .started = started, .budget = budget, .harmony = harmony};
}

void bind_serving(nanobind::module_& m);
