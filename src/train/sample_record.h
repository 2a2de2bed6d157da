#pragma once
// --record-samples (private to the train layer): every counted step's sample ids of every rank, a
// line of <output>/samples.jsonl each ({"epoch":1,"step":3,"ids":[[...],[...]]}), written by rank
// 0. Tests read it to prove that each sample is trained once an epoch, across resumes and elastic
// changes.

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/train/config.h"
#include "ddp/train/distributed.h"

namespace ddp::train {

// Every rank's `ids` of the step in flight, as bytes (a collective).
std::vector<std::string> gather_sample_ids(const Distributed& dist, const torch::Tensor& ids);

// The line of counted step `step` of `epoch` (1-based), from every rank's gathered ids; rank 0
// writes it. A fresh run starts the file; a resumed run (cut to its checkpoint's step) or a new
// rank 0 after an elastic change (completed by the heal) goes on. "" without --record-samples.
std::string record_samples(const Config& config, const Distributed& dist, int64_t epoch,
                           int64_t step, const std::vector<std::string>& all);

}  // namespace ddp::train
