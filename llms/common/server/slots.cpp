#include "slots.h"

#include <algorithm>

#include "api_error.h"
#include "edgellm/error.h"

namespace edgellm {

using json = nlohmann::json;

bool valid_slot_filename(std::string_view name) {
  return !name.empty() && name.size() <= 128 && name.front() != '.' &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
         });
}

namespace {

int parse_slot(const Scheduler& scheduler, const std::string& id) {
  const bool digits =
      !id.empty() && id.size() <= 6 &&
      std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int slot = digits ? std::stoi(id) : -1;
  if (slot < 0 || slot >= scheduler.slots())
    bad("id_slot", "no slot '" + id + "': slots are 0 to " + std::to_string(scheduler.slots() - 1) +
                       " (--parallel " + std::to_string(scheduler.slots()) + ")");
  return slot;
}

std::string filename_of(const json& body) {
  if (!body.is_object()) bad("", "the request body must be a JSON object");
  for (const auto& [name, value] : body.items())
    if (name != "filename")
      bad(name, "unsupported field '" + name + "': this route takes only 'filename'");
  const auto it = body.find("filename");
  if (it == body.end() || !it->is_string()) bad("filename", "missing string field 'filename'");
  const std::string name = it->get<std::string>();
  if (!valid_slot_filename(name))
    bad("filename",
        "'filename' must be a plain file name: 1 to 128 of A-Z a-z 0-9 . _ -, "
        "not starting with '.'");
  return name;
}

}  // namespace

json slot_action(Scheduler& scheduler, const std::filesystem::path& dir, const std::string& id,
                 const std::string& action, const json& body) {
  if (dir.empty())
    throw ApiError{400, "slot saving is off; start the server with --slot-save-path DIR", "",
                   "slot_saving_off"};
  const int slot = parse_slot(scheduler, id);
  if (action != "save" && action != "restore" && action != "erase")
    bad("action", "unknown action '" + action + "': use ?action=save, restore or erase");
  const std::string filename =
      action == "erase" && (body.is_null() || body.empty()) ? "" : filename_of(body);
  try {
    if (action == "erase") return {{"id_slot", slot}, {"n_erased", scheduler.erase_slot(slot)}};
    if (action == "save") {
      const Scheduler::SlotFile r = scheduler.save_slot(slot, dir, filename);
      return {{"id_slot", slot},
              {"filename", filename},
              {"n_saved", r.tokens},
              {"n_written", r.bytes},
              {"timings", {{"save_ms", r.ms}}}};
    }
    const Scheduler::SlotFile r = scheduler.restore_slot(slot, dir, filename);
    return {{"id_slot", slot},        {"filename", filename},
            {"n_restored", r.tokens}, {"n_cached", r.cached_tokens},
            {"n_read", r.bytes},      {"timings", {{"restore_ms", r.ms}}}};
  } catch (const Error& e) {
    if (scheduler.stopping()) throw ApiError{503, "the server is shutting down", "", ""};
    // The engine names the file by its path: the client knows it by its name.
    std::string message = e.what();
    const std::string path = (dir / filename).string();
    if (const size_t at = message.find(path); at != std::string::npos)
      message.replace(at, path.size(), filename);
    bad(action == "restore" ? "filename" : "", message);  // a save fails for the slot or the disk
  }
}

}  // namespace edgellm
