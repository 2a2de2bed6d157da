#include "in_order.h"

#include <algorithm>

namespace ddp::fsdp {

std::vector<Unit*> InOrder::take_until(size_t end) {
  std::vector<Unit*> due;
  for (end = std::min(end, units_.size()); next_ < end; ++next_) due.push_back(units_[next_]);
  return due;
}

std::vector<Unit*> InOrder::through(const Unit* unit, size_t ahead) {
  auto it = std::find(units_.begin(), units_.end(), unit);
  if (it == units_.end()) return {};
  return take_until(static_cast<size_t>(it - units_.begin()) + 1 + ahead);
}

std::vector<Unit*> InOrder::rest() {
  return take_until(units_.size());
}

}  // namespace ddp::fsdp
