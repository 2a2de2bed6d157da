#include "ddp/train/sharded_weights.h"

#include <exception>
#include <map>
#include <memory>

#include "ddp/train/pt_file.h"

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

void save_weights(FullyShardedDataParallel& model, const std::string& path, bool write,
                  const std::string& prefix) {
  std::unique_ptr<PtFileWriter> file;
  std::exception_ptr error;
  StateDict deferred;
  if (write) {
    try {
      deferred = deferred_state_dict(model, prefix);
      file = std::make_unique<PtFileWriter>(path);
      file->begin(to_ivalue(deferred));
    } catch (...) {
      error = std::current_exception();
    }
  }
  // The gathers go on whatever happened to the file: the other ranks take part in them too.
  write_gathered_parameters(model, deferred, prefix,
                            write ? DeferredWrite([&](const auto& placeholder, const auto& value) {
                              if (error) return;
                              try {
                                file->write(placeholder, value);
                              } catch (...) {
                                error = std::current_exception();
                              }
                            })
                                  : DeferredWrite());
  if (error) std::rethrow_exception(error);
  if (file) file->commit();
}

}  // namespace ddp::train
