#pragma once
// A phase of training, named in both places at once: a span of the timeline (--timeline) and the
// flight recorder's phase label, which the stall warning, the flight records and --diagnose give
// for the collectives issued in it ("step 12: forward").

#include <cstdint>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "ddp/comm/process_group.h"
#include "ddp/train/timeline.h"

namespace ddp::train {

class Phase {
 public:
  // From now to the destruction: the span `name` of `category` and optimizer step `step` (-1:
  // none) on lane 0 of `timeline` (nullptr: no span). From now on: the label `label` of the
  // collectives `group` issues ("": the label stays as it was). The label outlives the phase
  // until the next one sets another: a collective issued right after (the first step's gather
  // of shapes after the forward) is reported under the phase that led to it.
  Phase(comm::ProcessGroup& group, std::string label, Timeline* timeline, const char* name,
        const char* category, int64_t step = -1)
      : span_(timeline, name, category, step) {
    if (!label.empty()) group.set_phase(std::move(label));
  }
  // A label only, no span.
  Phase(comm::ProcessGroup& group, std::string label)
      : Phase(group, std::move(label), nullptr, "", "") {}

 private:
  Timeline::Scope span_;  // not copyable, so neither is a Phase
};

// A phase of optimizer step `step`: the span `name` and the label "step <step>: <name>".
inline Phase step_phase(comm::ProcessGroup& group, Timeline* timeline, const char* name,
                        int64_t step) {
  return Phase(group, fmt::format("step {}: {}", step, name), timeline, name, "compute", step);
}

}  // namespace ddp::train
