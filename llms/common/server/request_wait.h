// How an HTTP worker waits on its request's stream while watching its client.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "connections.h"
#include "edgellm/scheduler.h"

namespace edgellm {

// RequestStream::wait for up to `timeout`, in slices of 20 ms: a client that closed its
// connection is seen within one slice and its request cancelled before the engine's next
// step. Writes alone would find out tokens later (the first write after a close still lands
// in the socket's buffer), and a whole-reply request never writes until it ends; meanwhile
// the next request (the same client's, after a short answer) waits behind the dead one's
// decode steps. Returns true once the request is finished (a cancelled one too).
inline bool wait_watching_client(RequestStream& stream, std::string& text,
                                 std::chrono::milliseconds timeout,
                                 std::vector<TokenLogprobs>* logprobs = nullptr) {
  constexpr std::chrono::milliseconds kSlice{20};
  for (std::chrono::milliseconds waited{0};;) {
    const size_t had = text.size();
    const bool done = stream.wait(text, std::min(kSlice, timeout - waited), logprobs);
    waited += kSlice;
    if (!done && client_gone()) stream.cancel();
    if (done || text.size() > had || (logprobs && !logprobs->empty()) || waited >= timeout)
      return done;
  }
}

}  // namespace edgellm
