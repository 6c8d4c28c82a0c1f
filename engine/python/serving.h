// The serving part of the binding (see serving.cpp).
#pragma once

#include <nanobind/nanobind.h>

#include <memory>

#include "edgellm/json_grammar.h"

// A compiled response_format / JSON schema as Python holds it (the grammar
// itself is an incomplete type): passed as `grammar=` to generate(),
// generate_timed() and Scheduler.submit().
struct PyGrammar {
  std::shared_ptr<const edgellm::JsonGrammar> grammar;
};

void bind_serving(nanobind::module_& m);
