#include "ddp/train/pt_file.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/common/files.h"
#include "torch_errors.h"

namespace ddp::train {

// ---------------------------------------------------------------------------------------------
// Writing: LibTorch's own pickler and zip writer.

namespace {

// `value` pickled as torch.save does, and its tensors, one per storage in the order their records
// are named (0, 1, ...).
std::pair<std::string, std::vector<at::Tensor>> pickled(const c10::IValue& value) {
  std::string pickle;
  int64_t next_storage = 0;
  // tag_aggregates=false: no torch.jit._pickle.restore_type_tag around dicts and lists, which
  // Python's weights-only loader refuses. Storages are named 0, 1, ... in the order written, the
  // order of tensorData().
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) { pickle.append(data, size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/[&](const at::Tensor&) { return std::to_string(next_storage++); },
      /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  return {std::move(pickle), pickler.tensorData()};
}

void write_record(caffe2::serialize::PyTorchStreamWriter& zip, size_t index,
                  const at::Tensor& tensor) {
  const auto data = torch::jit::getWriteableTensorData(tensor);
  zip.writeRecord("data/" + std::to_string(index), data.data(), data.sizeInBytes());
}

// The records before the tensors': the pickle, and the byte order as Python 2.x writes it.
void write_head(caffe2::serialize::PyTorchStreamWriter& zip, const std::string& pickle) {
  zip.writeRecord("data.pkl", pickle.data(), pickle.size());
  zip.writeRecord("byteorder", "little", 6);
}

}  // namespace

std::string serialize_pt(const c10::IValue& value) {
  const auto [pickle, tensors] = pickled(value);
  std::string out;
  caffe2::serialize::PyTorchStreamWriter zip([&](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  write_head(zip, pickle);
  for (size_t i = 0; i < tensors.size(); ++i) write_record(zip, i, tensors[i]);
  zip.writeEndOfFile();
  return out;
}

void write_pt_file(const std::string& path, const c10::IValue& value) {
  PtFileWriter file(path);  // straight into the file: no copy of its contents in memory
  file.begin(value);
  file.commit();
}

PtFileWriter::PtFileWriter(const std::string& path) : file_(std::make_unique<AtomicFile>(path)) {
  // The zip writer takes no error from its sink and would write its end from its destructor: the
  // first error is kept and rethrown by check_sink(), the bytes after it dropped.
  zip_ = std::make_unique<caffe2::serialize::PyTorchStreamWriter>(
      [this](const void* data, size_t size) {
        if (!failed_) {
          try {
            file_->append({static_cast<const char*>(data), size});
          } catch (...) {
            failed_ = std::current_exception();
          }
        }
        return size;
      });
}

PtFileWriter::~PtFileWriter() = default;

at::Tensor PtFileWriter::deferred(at::IntArrayRef sizes, c10::ScalarType dtype) {
  const int64_t numel = c10::multiply_integers(sizes);
  c10::Storage storage(c10::Storage::use_byte_size_t(),
                       static_cast<size_t>(numel) * c10::elementSize(dtype),
                       c10::DataPtr(nullptr, c10::Device(c10::kCPU)), /*allocator=*/nullptr,
                       /*resizable=*/false);
  return at::empty({0}, at::TensorOptions(dtype)).set_(storage, 0, sizes);
}

bool PtFileWriter::is_deferred(const at::Tensor& tensor) {
  return tensor.defined() && tensor.has_storage() && tensor.storage().data_ptr().get() == nullptr &&
         tensor.storage().nbytes() > 0;
}

bool PtFileWriter::awaits(const at::Tensor& deferred) const {
  return pending_.count(deferred.storage().unsafeGetStorageImpl()) > 0;
}

void PtFileWriter::begin(const c10::IValue& value) {
  DDP_CHECK(!std::exchange(begun_, true), "PtFileWriter::begin once");
  const auto [pickle, tensors] = pickled(value);
  write_head(*zip_, pickle);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (PtFileWriter::is_deferred(tensors[i])) {
      pending_[tensors[i].storage().unsafeGetStorageImpl()] = std::to_string(i);
    } else {
      write_record(*zip_, i, tensors[i]);
    }
  }
  check_sink();
}

void PtFileWriter::write(const at::Tensor& deferred, const at::Tensor& data) {
  auto it = pending_.find(deferred.storage().unsafeGetStorageImpl());
  DDP_CHECK(it != pending_.end(), "a placeholder of this file not written yet");
  DDP_CHECK(data.scalar_type() == deferred.scalar_type() && data.sizes() == deferred.sizes(),
            "data of the placeholder's sizes and dtype");
  const at::Tensor cpu = data.detach().to(at::kCPU).contiguous();
  zip_->writeRecord("data/" + it->second, cpu.data_ptr(), cpu.nbytes());
  pending_.erase(it);
  check_sink();
}

void PtFileWriter::commit() {
  if (!pending_.empty()) {
    throw Error(
        fmt::format("a torch.save file ended with {} tensor(s) not written", pending_.size()));
  }
  zip_->writeEndOfFile();
  check_sink();
  file_->commit();
}

void PtFileWriter::check_sink() const {
  if (failed_) std::rethrow_exception(failed_);
}

// ---------------------------------------------------------------------------------------------
// Reading: the zip through LibTorch's reader, the pickle through our own small interpreter, which
// understands exactly what state dicts contain (LibTorch's unpickler turns an OrderedDict, the
// type of every model.state_dict(), into None) and reports anything else as bad input.

namespace {

// A complaint about the file's contents; parse_pt() puts the origin in front.
struct Corrupt {
  std::string what;
};

// The zip reader's view of the bytes, bounds-checked: a corrupt directory cannot read past them.
class BytesAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesAdapter(std::string_view bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<uint64_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  std::string_view bytes_;
};

// A value on the pickle machine's stack. Besides ordinary values (IValue) a pickle holds class
// references (GLOBAL), tuples that may contain them, and tensor storages.
// Tuples are immutable, so copies (the memo's) share their elements.
struct Item {
  enum class Kind { kValue, kGlobal, kTuple, kStorage };
  Kind kind = Kind::kValue;
  c10::IValue value;                                  // kValue; kStorage: a flat tensor
  std::string name;                                   // kGlobal: "module.name"
  std::shared_ptr<const std::vector<Item>> elements;  // kTuple
  int depth = 0;                                      // kTuple: nesting
};

// Deeper nesting is refused: no state dict needs it, and it bounds the recursion below.
constexpr int kMaxDepth = 64;

Item value_item(c10::IValue v) {
  Item item;
  item.value = std::move(v);
  return item;
}

c10::IValue to_value(const Item& item) {
  switch (item.kind) {
    case Item::Kind::kValue:
      return item.value;
    case Item::Kind::kTuple: {
      std::vector<c10::IValue> values;
      for (const auto& e : *item.elements) values.push_back(to_value(e));
      return c10::ivalue::Tuple::create(std::move(values));
    }
    case Item::Kind::kGlobal:
      throw Corrupt{
          fmt::format("holds an object of class '{}', which is not read (only dicts, "
                      "lists, numbers, strings and tensors are)",
                      item.name)};
    case Item::Kind::kStorage:
      break;
  }
  throw Corrupt{"holds a bare tensor storage"};
}

int64_t int_of(const Item& item, const char* what) {
  if (item.kind != Item::Kind::kValue || !item.value.isInt()) {
    throw Corrupt{fmt::format("pickle: {} is not an integer", what)};
  }
  return item.value.toInt();
}

std::vector<int64_t> ints_of(const Item& item, const char* what) {
  if (item.kind != Item::Kind::kTuple)
    throw Corrupt{fmt::format("pickle: {} is not a tuple", what)};
  std::vector<int64_t> out;
  for (const auto& e : *item.elements) out.push_back(int_of(e, what));
  return out;
}

c10::ScalarType storage_dtype(const std::string& global) {
  static const std::map<std::string, c10::ScalarType> kTypes = {
      {"torch.FloatStorage", at::kFloat},
      {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},
      {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},
      {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},
      {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},
      {"torch.BoolStorage", at::kBool},
      {"torch.ComplexFloatStorage", at::kComplexFloat},
      {"torch.ComplexDoubleStorage", at::kComplexDouble}};
  auto it = kTypes.find(global);
  if (it == kTypes.end()) throw Corrupt{fmt::format("unsupported storage type '{}'", global)};
  return it->second;
}

// storage.as_strided(size, stride, offset), after checking it stays inside the storage.
at::Tensor view_of_storage(const at::Tensor& storage, int64_t offset,
                           const std::vector<int64_t>& size, const std::vector<int64_t>& stride) {
  if (size.size() != stride.size()) throw Corrupt{"tensor with as many sizes as strides"};
  int64_t last = offset;  // the last element's index in the storage
  int64_t numel = 1;
  // A tensor with a dimension of size 0 ([3, 0]) has no element, whatever its other sizes.
  const bool empty = std::find(size.begin(), size.end(), 0) != size.end();
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] < 0 || stride[d] < 0) throw Corrupt{"tensor with a negative size or stride"};
    // Views that repeat elements (stride 0) never occur in state dicts; refusing them bounds
    // the size of what a file can make us allocate to the size of the file.
    if (__builtin_mul_overflow(numel, size[d], &numel) || (!empty && numel > storage.numel())) {
      throw Corrupt{"tensor with more elements than its storage"};
    }
    int64_t extent = 0;
    if (size[d] > 0 && (__builtin_mul_overflow(size[d] - 1, stride[d], &extent) ||
                        __builtin_add_overflow(last, extent, &last))) {
      throw Corrupt{"tensor larger than its storage"};
    }
  }
  if (offset < 0 || (!empty && last >= storage.numel())) {
    throw Corrupt{fmt::format("tensor of size [{}] outside its storage of {} elements",
                              fmt::join(size, ", "), storage.numel())};
  }
  return storage.as_strided(size, stride, offset);
}

// Runs the pickle opcodes that torch.save (protocol 2) and LibTorch's pickler emit.
class PickleReader {
 public:
  // Storage `key`'s elements (record data/<key>) as a 1-D tensor of `numel`.
  using StorageReader =
      std::function<at::Tensor(const std::string& key, c10::ScalarType dtype, int64_t numel)>;
  PickleReader(std::string_view pickle, StorageReader read_storage)
      : data_(pickle), read_storage_(std::move(read_storage)) {}

  c10::IValue run() {
    while (true) {
      const uint8_t op = u8();
      if (op == '.') return to_value(pop());  // STOP
      if (!push_literal(op) && !operate(op)) {
        throw Corrupt{fmt::format("pickle: unsupported opcode 0x{:02x} at byte {}", op, pos_ - 1)};
      }
    }
  }

 private:
  // -- opcodes
  // The opcode table in two halves: the opcodes that push a value written in the bytes, and
  // those that work on the framing, the stack, the memo and objects. Each returns false for an
  // opcode it does not know, before reading any byte. One line per opcode, named as in Python's
  // pickletools.
  // clang-format off
  bool push_literal(uint8_t op) {
    switch (op) {
      case '}': push(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get())); break;
      case ']': push(c10::impl::GenericList(c10::AnyType::get())); break;
      case ')': stack_.push_back(tuple({})); break;               // EMPTY_TUPLE
      case 'N': push(c10::IValue()); break;
      case 0x88: push(true); break;
      case 0x89: push(false); break;
      case 'K': push(static_cast<int64_t>(u8())); break;          // BININT1
      case 'M': push(static_cast<int64_t>(le(2))); break;         // BININT2
      case 'J': push(static_cast<int64_t>(static_cast<int32_t>(le(4)))); break;  // BININT
      case 0x8a: push(long1()); break;                            // LONG1
      case 'G': push(binfloat()); break;                          // BINFLOAT
      case 'X': push(std::string(bytes(le(4)))); break;           // BINUNICODE
      case 0x8c: push(std::string(bytes(u8()))); break;           // SHORT_BINUNICODE
      default: return false;
    }
    return true;
  }

  bool operate(uint8_t op) {
    switch (op) {
      case 0x80: u8(); break;                                     // PROTO
      case 0x95: bytes(8); break;                                 // FRAME
      case '(': marks_.push_back(stack_.size()); break;           // MARK
      case 't': stack_.push_back(tuple(pop_to_mark())); break;    // TUPLE
      case 0x85: stack_.push_back(tuple(pop_n(1))); break;        // TUPLE1
      case 0x86: stack_.push_back(tuple(pop_n(2))); break;        // TUPLE2
      case 0x87: stack_.push_back(tuple(pop_n(3))); break;        // TUPLE3
      case 'q': memo_[le(1)] = top(); break;                      // BINPUT
      case 'r': memo_[le(4)] = top(); break;                      // LONG_BINPUT
      case 0x94: {                                                // MEMOIZE
        const uint64_t key = memo_.size();
        memo_[key] = top();
        break;
      }
      case 'h': stack_.push_back(memo(le(1))); break;             // BINGET
      case 'j': stack_.push_back(memo(le(4))); break;             // LONG_BINGET
      case 'c': {                                                 // GLOBAL
        const std::string module = line();  // two statements: the order matters
        global(module, line());
        break;
      }
      case 0x93: {                                                // STACK_GLOBAL
        const std::string name = string_of(pop());
        global(string_of(pop()), name);
        break;
      }
      case 'a': append(pop_n(1)); break;                          // APPEND
      case 'e': append(pop_to_mark()); break;                     // APPENDS
      case 's': setitems(pop_n(2)); break;                        // SETITEM
      case 'u': setitems(pop_to_mark()); break;                   // SETITEMS
      case 'R': reduce(); break;
      case 'b': build(); break;
      case 'Q': persistent_load(); break;                         // BINPERSID
      default: return false;
    }
    return true;
  }
  // clang-format on

  // -- bytes
  std::string_view bytes(uint64_t n) {
    if (n > data_.size() - pos_) throw Corrupt{"pickle: truncated"};
    auto out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint8_t u8() { return static_cast<uint8_t>(bytes(1)[0]); }
  uint64_t le(int n) {  // little-endian unsigned
    const auto b = bytes(n);
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[i]);
    return v;
  }
  int64_t long1() {
    const int n = u8();
    if (n > 8) throw Corrupt{"pickle: integer wider than 64 bits"};
    if (n == 0) return 0;
    uint64_t v = le(n);
    if (n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    return static_cast<int64_t>(v);
  }
  double binfloat() {  // big-endian IEEE 754
    const auto b = bytes(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(b[i]);
    double d = 0;
    std::memcpy(&d, &v, sizeof d);
    return d;
  }
  std::string line() {
    const size_t end = data_.find('\n', pos_);
    if (end == std::string_view::npos) throw Corrupt{"pickle: truncated"};
    std::string out(data_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }

  // -- stack
  void push(c10::IValue v) { stack_.push_back(value_item(std::move(v))); }
  Item& top() {
    if (stack_.empty()) throw Corrupt{"pickle: stack underflow"};
    return stack_.back();
  }
  Item pop() {
    Item item = std::move(top());
    stack_.pop_back();
    return item;
  }
  std::vector<Item> pop_n(size_t n) {
    if (stack_.size() < n || (!marks_.empty() && stack_.size() - n < marks_.back())) {
      throw Corrupt{"pickle: stack underflow"};
    }
    std::vector<Item> out(std::make_move_iterator(stack_.end() - n),
                          std::make_move_iterator(stack_.end()));
    stack_.resize(stack_.size() - n);
    return out;
  }
  std::vector<Item> pop_to_mark() {
    if (marks_.empty()) throw Corrupt{"pickle: no mark"};
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<Item> out(std::make_move_iterator(stack_.begin() + mark),
                          std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return out;
  }
  const Item& memo(uint64_t key) const {
    auto it = memo_.find(key);
    if (it == memo_.end()) throw Corrupt{"pickle: reference to an unknown memo entry"};
    return it->second;
  }
  static Item tuple(std::vector<Item> elements) {
    Item item;
    item.kind = Item::Kind::kTuple;
    for (const auto& e : elements) item.depth = std::max(item.depth, e.depth + 1);
    if (item.depth > kMaxDepth) throw Corrupt{"pickle: nested too deeply"};
    item.elements = std::make_shared<const std::vector<Item>>(std::move(elements));
    return item;
  }
  static std::string string_of(const Item& item) {
    if (item.kind != Item::Kind::kValue || !item.value.isString()) {
      throw Corrupt{"pickle: expected a string"};
    }
    return item.value.toStringRef();
  }

  // -- objects
  void global(const std::string& module, const std::string& name) {
    Item item;
    item.kind = Item::Kind::kGlobal;
    item.name = module + "." + name;
    stack_.push_back(std::move(item));
  }

  // A value about to go into `container`: refused when that would make a cycle (a leak) or nest
  // deeper than kMaxDepth.
  static c10::IValue insertable(const Item& item, const c10::IValue& container) {
    c10::IValue value = to_value(item);
    check_insertable(value, container, 1);
    return value;
  }
  static void check_insertable(const c10::IValue& v, const c10::IValue& container, int depth) {
    if (!v.isList() && !v.isGenericDict() && !v.isTuple()) return;
    if (v.isSameIdentity(container)) throw Corrupt{"pickle: a container inside itself"};
    if (depth > kMaxDepth) throw Corrupt{"pickle: nested too deeply"};
    if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) check_insertable(e, container, depth + 1);
    } else if (v.isTuple()) {
      for (const c10::IValue& e : v.toTupleRef().elements())
        check_insertable(e, container, depth + 1);
    } else {
      for (const auto& entry : v.toGenericDict())
        check_insertable(entry.value(), container, depth + 1);
    }
  }

  void append(std::vector<Item> items) {
    Item& list = top();
    if (list.kind != Item::Kind::kValue || !list.value.isList()) {
      throw Corrupt{"pickle: APPEND to something that is not a list"};
    }
    auto values = list.value.toList();
    for (const auto& item : items) values.push_back(insertable(item, list.value));
  }

  void setitems(std::vector<Item> items) {
    Item& dict = top();
    if (dict.kind != Item::Kind::kValue || !dict.value.isGenericDict() || items.size() % 2) {
      throw Corrupt{"pickle: SETITEM on something that is not a dict"};
    }
    auto d = dict.value.toGenericDict();
    for (size_t i = 0; i < items.size(); i += 2) {
      c10::IValue key = to_value(items[i]);
      if (!key.isString() && !key.isInt())
        throw Corrupt{"pickle: a dict key is not a string or int"};
      d.insert_or_assign(std::move(key), insertable(items[i + 1], dict.value));
    }
  }

  void reduce() {
    Item args = pop();
    Item callable = pop();
    if (callable.kind != Item::Kind::kGlobal || args.kind != Item::Kind::kTuple) {
      throw Corrupt{"pickle: REDUCE without a class and arguments"};
    }
    const auto& a = *args.elements;
    const std::string& f = callable.name;
    if (f == "collections.OrderedDict" && a.empty()) {
      push(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
    } else if (f == "torch._utils._rebuild_tensor_v2" && a.size() >= 4 &&
               a[0].kind == Item::Kind::kStorage) {
      // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
      push(view_of_storage(a[0].value.toTensor(), int_of(a[1], "storage offset"),
                           ints_of(a[2], "size"), ints_of(a[3], "stride")));
    } else if (f == "torch._utils._rebuild_parameter" && !a.empty() &&
               a[0].kind == Item::Kind::kValue && a[0].value.isTensor()) {
      push(a[0].value);  // (data, requires_grad, backward_hooks): the data is what we need
    } else {
      throw Corrupt{
          fmt::format("holds an object of class '{}', which is not read (only dicts, "
                      "lists, numbers, strings and tensors are)",
                      f)};
    }
  }

  void build() {
    pop();  // the state: an OrderedDict's _metadata (module versions), not needed
    const Item& object = top();
    const bool dict_or_tensor = object.kind == Item::Kind::kValue &&
                                (object.value.isGenericDict() || object.value.isTensor());
    if (!dict_or_tensor) throw Corrupt{"pickle: BUILD on an unsupported object"};
  }

  // ('storage', torch.<Type>Storage, key, location, numel): the storage's bytes are record
  // data/<key>. The location (cpu, cuda:0, ...) is ignored: every tensor is read into the CPU.
  void persistent_load() {
    const Item id = pop();
    if (id.kind != Item::Kind::kTuple || id.elements->size() != 5 ||
        (*id.elements)[1].kind != Item::Kind::kGlobal ||
        string_of((*id.elements)[0]) != "storage") {
      throw Corrupt{"pickle: unsupported persistent id (not a tensor storage)"};
    }
    const auto& e = *id.elements;
    const std::string key = string_of(e[2]);
    auto cached = storages_.find(key);
    if (cached == storages_.end()) {
      const int64_t numel = int_of(e[4], "storage size");
      if (numel < 0) throw Corrupt{fmt::format("storage {} of {} elements", key, numel)};
      cached = storages_.emplace(key, read_storage_(key, storage_dtype(e[1].name), numel)).first;
    }
    Item item;
    item.kind = Item::Kind::kStorage;
    item.value = cached->second;
    stack_.push_back(std::move(item));
  }

  std::string_view data_;
  size_t pos_ = 0;
  StorageReader read_storage_;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Item> memo_;
  std::map<std::string, at::Tensor> storages_;
};

}  // namespace

namespace {

// The pickle of the torch.save file in `bytes`, its storages read by `read_storage(zip, name,
// dtype, numel)` (name: the record's).
using ZipStorageReader =
    std::function<at::Tensor(caffe2::serialize::PyTorchStreamReader& zip, const std::string& name,
                             c10::ScalarType dtype, int64_t numel)>;
c10::IValue parse_zip(std::string_view bytes, const std::string& origin,
                      const ZipStorageReader& read_storage) {
  if (bytes.empty()) throw InputError(fmt::format("{}: empty file", origin));
  if (bytes.size() < 4 || bytes.substr(0, 4) != std::string_view("PK\x03\x04", 4)) {
    throw InputError(
        fmt::format("{}: not a PyTorch zip file{}", origin,
                    static_cast<uint8_t>(bytes[0]) == 0x80
                        ? " (a legacy torch.save file: save it again with a current PyTorch)"
                        : ""));
  }
  try {
    caffe2::serialize::PyTorchStreamReader zip(std::make_shared<BytesAdapter>(bytes));
    if (zip.hasRecord("constants.pkl")) {
      throw Corrupt{
          "a TorchScript archive (torch::save(module) or torch.jit.save), not a state "
          "dict: save model.state_dict() instead"};
    }
    if (!zip.hasRecord("data.pkl")) throw Corrupt{"no data.pkl record"};
    auto [pickle, size] = zip.getRecord("data.pkl");
    auto read = [&](const std::string& key, c10::ScalarType dtype, int64_t numel) {
      const std::string name = "data/" + key;
      if (!zip.hasRecord(name)) throw Corrupt{fmt::format("record {} is missing", name)};
      return read_storage(zip, name, dtype, numel);
    };
    return PickleReader({static_cast<const char*>(pickle.get()), size}, read).run();
  } catch (const Corrupt& e) {
    throw InputError(fmt::format("{}: {}", origin, e.what));
  } catch (const c10::Error& e) {
    throw InputError(fmt::format("{}: corrupt or truncated: {}", origin, first_line_of(e)));
  }
}

// A record's bytes copied into a new tensor of `numel` elements.
at::Tensor copied_storage(caffe2::serialize::PyTorchStreamReader& zip, const std::string& name,
                          c10::ScalarType dtype, int64_t numel) {
  auto [data, size] = zip.getRecord(name);
  const uint64_t expected = static_cast<uint64_t>(numel) * c10::elementSize(dtype);
  if (size != expected) {
    throw Corrupt{fmt::format("record {} has {} bytes, its storage needs {} x {}", name, size,
                              numel, c10::elementSize(dtype))};
  }
  at::Tensor storage = at::empty({numel}, at::TensorOptions(dtype));
  if (size > 0) std::memcpy(storage.data_ptr(), data.get(), size);
  return storage;
}

// A file mapped read-only (its pages private: a tensor written to gets its own copy).
class Mapping {
 public:
  explicit Mapping(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      throw InputError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    }
    struct stat st {};
    const bool ok = ::fstat(fd, &st) == 0;
    size_ = ok ? static_cast<size_t>(st.st_size) : 0;
    if (ok && size_ > 0) {
      void* at = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      data_ = at == MAP_FAILED ? nullptr : static_cast<const char*>(at);
    }
    const int err = errno;
    ::close(fd);
    if (!ok || (size_ > 0 && data_ == nullptr)) {
      throw InputError(fmt::format("{}: cannot read: {}", path, std::strerror(err)));
    }
  }
  ~Mapping() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  std::string_view bytes() const { return {data_, size_}; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

c10::IValue parse_pt(std::string_view bytes, const std::string& origin) {
  return parse_zip(bytes, origin, copied_storage);
}

c10::IValue read_pt_file(const std::string& path) {
  auto mapping = std::make_shared<Mapping>(path);
  const std::string_view file = mapping->bytes();
  // Each storage a view of its record in the mapping, which the tensors keep alive. As Python's
  // torch.load(mmap=True), this takes a record's bytes to be stored, not compressed: what
  // torch.save and LibTorch's writer write.
  auto view = [&](caffe2::serialize::PyTorchStreamReader& zip, const std::string& name,
                  c10::ScalarType dtype, int64_t numel) -> at::Tensor {
    const size_t itemsize = c10::elementSize(dtype);
    const uint64_t offset = zip.getRecordOffset(name);
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(numel), itemsize, &nbytes) ||
        offset > file.size() || nbytes > file.size() - offset) {
      throw Corrupt{fmt::format("record {} of {} x {} bytes runs past the file's end", name, numel,
                                itemsize)};
    }
    const char* data = file.data() + offset;
    if (numel == 0 || reinterpret_cast<uintptr_t>(data) % itemsize != 0) {
      return copied_storage(zip, name, dtype, numel);  // not aligned for its dtype
    }
    return at::from_blob(
        const_cast<char*>(data), {numel}, [mapping](void*) {}, at::TensorOptions(dtype));
  };
  return parse_zip(file, path, view);
}

}  // namespace ddp::train
