// The tool-calling part of the binding (see tools.cpp).
#pragma once

#include <nanobind/nanobind.h>

// `error`: edgellm.Error, the base of the ToolRequestError it defines.
void bind_tools(nanobind::module_& m, nanobind::handle error);
