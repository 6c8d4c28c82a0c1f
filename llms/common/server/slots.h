// POST /slots/{id}?action=save|restore|erase, llama-server's routes over our
// prefix cache (edgellm/scheduler.h): `save` writes the cached blocks of the
// last prompt slot {id} served to DIR/filename, `restore` reads such a file
// back into the cache (the next prompt that starts the same way loads it
// instead of prefilling it), `erase` makes the slot forget its last prompt.
// DIR is --slot-save-path; without it every action is refused.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "edgellm/scheduler.h"

namespace edgellm {

// A file name a client may send: 1 to 128 of [A-Za-z0-9._-], not starting with
// '.' (so never "..", a hidden file, or a save's temporary file), no '/'.
bool valid_slot_filename(std::string_view name);

// The JSON reply to one slot action; `id` and `action` as in the URL, `body`
// the request's JSON. ApiError (400, or 503 while stopping) otherwise.
nlohmann::json slot_action(Scheduler& scheduler, const std::filesystem::path& dir,
                           const std::string& id, const std::string& action,
                           const nlohmann::json& body);

}  // namespace edgellm
