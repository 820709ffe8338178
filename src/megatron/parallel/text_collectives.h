#pragma once
// Collectives over short text: control messages such as checkpoint reports and errors. They are
// built on a Communicator's tensor collectives, so a rank that never arrives is named by the
// watchdog as in any collective. `device` is where the communicator moves data (a GPU for NCCL);
// the text travels as u8 tensors there.
#include <string>
#include <vector>

#include "megatron/parallel/comm.h"

namespace megatron {

// root's text on every rank (the other ranks' `text` is ignored).
std::string broadcast_text(Communicator& comm, const std::string& text, int root, Device device);

// Every rank's text on `root`, in group-rank order; an empty vector on the other ranks. Each rank
// sends to the root alone (an all-to-all in which only the root receives).
std::vector<std::string> gather_text(Communicator& comm, const std::string& text, int root, Device device);

}  // namespace megatron
