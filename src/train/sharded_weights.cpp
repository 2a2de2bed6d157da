#include "ddp/train/sharded_weights.h"

#include <map>

namespace ddp::train {

StateDict deferred_state_dict(const FullyShardedDataParallel& model, const std::string& prefix) {
  StateDict state;
  // A tied weight is one meta tensor under each of its names (state_dict_keys), so one
  // placeholder: one record in the file, as torch.save stores a shared tensor.
  std::map<const void*, torch::Tensor> placeholders;
  for (const auto& [name, value] : model.state_dict_keys()) {
    torch::Tensor tensor;
    if (!value.is_meta()) {
      tensor = value.detach().clone();  // a buffer: this rank's
    } else {
      auto& p = placeholders[value.unsafeGetTensorImpl()];
      if (!p.defined()) p = PtFileWriter::deferred(value.sizes(), value.scalar_type());
      tensor = p;
    }
    state.emplace_back(prefix + name, tensor);
  }
  return state;
}

void write_gathered_parameters(FullyShardedDataParallel& model, const StateDict& deferred,
                               const std::string& prefix, const DeferredWrite& write) {
  const std::map<std::string, torch::Tensor> placeholders(deferred.begin(), deferred.end());
  model.gather_each_unit([&](const std::string& name, const torch::Tensor& value) {
    if (write) write(placeholders.at(prefix + name), value);
  });
}

PtFileWriter& StreamedFiles::open(const std::string& path, const c10::IValue& value) {
  files_.push_back(std::make_unique<PtFileWriter>(path));
  files_.back()->begin(value);
  return *files_.back();
}

void StreamedFiles::write(const torch::Tensor& placeholder, const torch::Tensor& data) {
  if (error) return;
  try {
    for (auto& file : files_) {
      if (file->awaits(placeholder)) file->write(placeholder, data);
    }
  } catch (...) {
    error = std::current_exception();
  }
}

DeferredWrite StreamedFiles::writer(bool writing) {
  if (!writing) return nullptr;
  return [this](const torch::Tensor& placeholder, const torch::Tensor& data) {
    write(placeholder, data);
  };
}

void save_weights(FullyShardedDataParallel& model, const std::string& path, bool write,
                  const std::string& prefix) {
  StreamedFiles files;
  StateDict deferred;
  PtFileWriter* file = nullptr;
  if (write) {
    try {
      deferred = deferred_state_dict(model, prefix);
      file = &files.open(path, to_ivalue(deferred));
    } catch (...) {
      files.error = std::current_exception();
    }
  }
  write_gathered_parameters(model, deferred, prefix, files.writer(write));
  if (files.error) std::rethrow_exception(files.error);
  if (file != nullptr) file->commit();
}

}  // namespace ddp::train
