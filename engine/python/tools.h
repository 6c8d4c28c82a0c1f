// The tool-calling part of the binding (see tools.cpp).
#pragma once

#include <nanobind/nanobind.h>

#include "edgellm/tool_calls.h"

// Raises edgellm.ToolRequestError(message), .param naming the field, for the engine's.
[[noreturn]] void raise_tool_error(const edgellm::ToolRequestError& e);

template <typename Fn>
auto with_tool_errors(Fn fn) {
  try {
    return fn();
  } catch (const edgellm::ToolRequestError& e) {
    raise_tool_error(e);
  }
}

// `error`: edgellm.Error, the base of the ToolRequestError it defines.
void bind_tools(nanobind::module_& m, nanobind::handle error);
