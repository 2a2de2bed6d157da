#pragma once
// The file format of Python's torch.save: a zip archive holding `data.pkl` (a pickle) and one
// record `data/<key>` per tensor storage. We write what Python's torch.load reads with its default
// weights_only=True, and read what Python's torch.save writes for state dicts and checkpoints.

#include <ATen/core/ivalue.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace caffe2::serialize {
class PyTorchStreamWriter;
}

namespace ddp {
class AtomicFile;
}

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

// parse_pt of a file, its path as the origin. The file is mapped, not read: each tensor is a view
// of its bytes in the file (copied where they are not aligned for its dtype), so only the parts a
// caller reads come into memory, as Python's torch.load(mmap=True). The file must stay as it is
// while the tensors live; checkpoints and model files are replaced by renames, never rewritten.
c10::IValue read_pt_file(const std::string& path);

// serialize_pt into `path`, atomically (ddp/common/files.h).
void write_pt_file(const std::string& path, const c10::IValue& value);

// A torch.save file written while its tensors' data arrives, for a value too large to hold at
// once (a sharded model's state, gathered one unit at a time): the value is pickled first with
// placeholders (deferred()) where tensors will be, then each placeholder's data is written as it
// comes, each tensor its own record. The file appears at `path` whole, atomically, at commit().
class PtFileWriter {
 public:
  explicit PtFileWriter(const std::string& path);
  ~PtFileWriter();
  PtFileWriter(const PtFileWriter&) = delete;
  PtFileWriter& operator=(const PtFileWriter&) = delete;

  // A contiguous CPU tensor of these sizes and dtype that holds no data, to stand in `value` for
  // one written later. Nothing may read it (its data pointer is null); the same placeholder under
  // two keys (tied weights) is one record, as torch.save stores a shared tensor.
  static at::Tensor deferred(at::IntArrayRef sizes, c10::ScalarType dtype);
  static bool is_deferred(const at::Tensor& tensor);  // a placeholder deferred() made
  // Whether `deferred` is a placeholder in this file's value not written yet.
  bool awaits(const at::Tensor& deferred) const;

  // Pickles `value` and writes every tensor's data in it but the placeholders'. Once.
  void begin(const c10::IValue& value);
  // The data of placeholder `deferred` (of its sizes and dtype; any device), written now.
  void write(const at::Tensor& deferred, const at::Tensor& data);
  // Ends the archive and renames it into place. Error when a placeholder was not written.
  void commit();

 private:
  void check_sink() const;  // rethrows a failed write of the file

  std::unique_ptr<AtomicFile> file_;
  std::exception_ptr failed_;  // the file's first write error (the zip writer cannot take it)
  std::unique_ptr<caffe2::serialize::PyTorchStreamWriter> zip_;
  std::map<const void*, std::string> pending_;  // placeholder storage -> its record's name
  bool begun_ = false;
};

}  // namespace ddp::train
