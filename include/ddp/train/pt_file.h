#pragma once
// The file format of Python's torch.save: a zip archive holding `data.pkl` (a pickle) and one
// record `data/<key>` per tensor storage. We write what Python's torch.load reads with its default
// weights_only=True, and read what Python's torch.save writes for state dicts and checkpoints.

#include <ATen/core/ivalue.h>

#include <string>
#include <string_view>

namespace ddp::train {

// `value` as a torch.save file. Values: dicts with string or int keys, lists, strings, ints,
// bools, tensors (any device; stored with their own storage). Floats are allowed, but Python
// 1.13's weights-only loader refuses them, so files meant for Python avoid them.
std::string serialize_pt(const c10::IValue& value);

// Parses a torch.save file: dicts (also OrderedDict, as model.state_dict() is saved), lists,
// tuples, strings, numbers, bools, None, tensors and nn.Parameters. Every tensor is returned on
// the CPU, whatever device it was saved from (what map_location="cpu" does in Python).
// Throws InputError starting with `origin` for anything else: not a zip file, a truncated or
// corrupt archive, a TorchScript archive, a pickle of other objects.
c10::IValue parse_pt(std::string_view bytes, const std::string& origin);

// parse_pt of a file, its path as the origin.
c10::IValue read_pt_file(const std::string& path);

// serialize_pt into `path`, atomically (ddp/common/files.h).
void write_pt_file(const std::string& path, const c10::IValue& value);

}  // namespace ddp::train
