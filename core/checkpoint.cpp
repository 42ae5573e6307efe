// core/checkpoint.cpp: HDF5 checkpoint writer (atomic) and reader.
#include "core/checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "core/check.h"

namespace ringtrain {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "ringtrain-checkpoint";
constexpr int kVersion = 1;

// The process-wide HDF5 lock: loader threads may be reading shards while a checkpoint is written.
std::recursive_mutex& lock() { return detail::hdf5_mutex(); }

struct Id {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Id() {
    if (id >= 0) close(id);
  }
  operator hid_t() const { return id; }
};

hid_t check(hid_t result, const fs::path& file, const std::string& object, const char* what) {
  if (result < 0)
    RT_THROW("checkpoint '", file.string(), "'", object.empty() ? "" : detail::str_cat(", object '", object, "'"), ": ", what,
             " (HDF5: ", detail::h5_error_text(), ")");
  return result;
}

void string_attribute(hid_t loc, const char* name, const std::string& value, const fs::path& file) {
  Id type{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(type, std::max<size_t>(1, value.size()));
  Id space{H5Screate(H5S_SCALAR), H5Sclose};
  Id attr{check(H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT), file, name, "create attribute"), H5Aclose};
  check(H5Awrite(attr, type, value.data()), file, name, "write attribute");
}

std::string read_string_attribute(hid_t loc, const char* name, const fs::path& file, const std::string& object) {
  if (H5Aexists(loc, name) <= 0) RT_THROW("checkpoint '", file.string(), "': '", object, "' has no attribute '", name, "'");
  Id attr{check(H5Aopen(loc, name, H5P_DEFAULT), file, object, "open attribute"), H5Aclose};
  Id type{H5Aget_type(attr), H5Tclose};
  std::string s(H5Tget_size(type), '\0');
  check(H5Aread(attr, type, s.data()), file, object, "read attribute");
  s.erase(std::find(s.begin(), s.end(), '\0'), s.end());
  return s;
}

void int_attribute(hid_t loc, const char* name, int value, const fs::path& file) {
  Id space{H5Screate(H5S_SCALAR), H5Sclose};
  Id attr{check(H5Acreate2(loc, name, H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT), file, name, "create attribute"),
          H5Aclose};
  check(H5Awrite(attr, H5T_NATIVE_INT32, &value), file, name, "write attribute");
}

// (file type, memory type) for a dtype; 16-bit floats travel as raw uint16.
std::pair<hid_t, hid_t> h5_types(DType t) {
  switch (t) {
    case DType::F32: return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT};
    case DType::F64: return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE};
    case DType::I32: return {H5T_STD_I32LE, H5T_NATIVE_INT32};
    case DType::I64: return {H5T_STD_I64LE, H5T_NATIVE_INT64};
    case DType::U8: return {H5T_STD_U8LE, H5T_NATIVE_UINT8};
    case DType::F16:
    case DType::BF16: return {H5T_STD_U16LE, H5T_NATIVE_UINT16};
  }
  return {H5T_NATIVE_FLOAT, H5T_NATIVE_FLOAT};
}

void write_group(hid_t file, const char* group_name, const NamedTensors& tensors, const fs::path& path) {
  Id group{check(H5Gcreate2(file, group_name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path, group_name, "create group"),
           H5Gclose};
  for (const auto& [name, tensor] : tensors) {
    const std::string object = detail::str_cat("/", group_name, "/", name);
    RT_CHECK(!name.empty() && name.find('/') == std::string::npos, "checkpoint: tensor name '", name,
             "' must be non-empty without '/'");
    RT_CHECK(tensor.defined(), "checkpoint: tensor '", name, "' is undefined");
    Tensor host = tensor.detach().to(Device::cpu());
    std::vector<hsize_t> dims(host.shape().begin(), host.shape().end());
    Id space{dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
             H5Sclose};
    auto [file_type, mem_type] = h5_types(host.dtype());
    Id ds{check(H5Dcreate2(group, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path, object,
                "create dataset"),
          H5Dclose};
    if (host.numel() > 0)
      check(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data_ptr()), path, object, "write dataset");
    if (host.dtype() == DType::F16 || host.dtype() == DType::BF16)
      string_attribute(ds, "dtype", std::string(dtype_name(host.dtype())), path);
  }
}

DType dtype_of(hid_t ds, hid_t type, const fs::path& path, const std::string& object) {
  if (H5Aexists(ds, "dtype") > 0) return parse_dtype(read_string_attribute(ds, "dtype", path, object));
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT && size == 4) return DType::F32;
  if (cls == H5T_FLOAT && size == 8) return DType::F64;
  if (cls == H5T_INTEGER && size == 4 && H5Tget_sign(type) == H5T_SGN_2) return DType::I32;
  if (cls == H5T_INTEGER && size == 8 && H5Tget_sign(type) == H5T_SGN_2) return DType::I64;
  if (cls == H5T_INTEGER && size == 1 && H5Tget_sign(type) == H5T_SGN_NONE) return DType::U8;
  RT_THROW("checkpoint '", path.string(), "': dataset '", object, "' has an unsupported type (class ",
           static_cast<int>(cls), ", ", size, " bytes)");
}

NamedTensors read_group(hid_t file, const char* group_name, const fs::path& path) {
  if (H5Lexists(file, group_name, H5P_DEFAULT) <= 0)
    RT_THROW("checkpoint '", path.string(), "' has no group '/", group_name, "'");
  Id group{check(H5Gopen2(file, group_name, H5P_DEFAULT), path, group_name, "open group"), H5Gclose};
  std::vector<std::string> names;
  // Creation order is not tracked by default; iterate by name and rely on callers matching by name.
  // The callback must not throw through HDF5's C frames: failures are reported by return value.
  const herr_t walked = H5Literate(
      group, H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
        try {
          static_cast<std::vector<std::string>*>(out)->push_back(name);
          return 0;
        } catch (...) {
          return -1;
        }
      },
      &names);
  check(walked, path, group_name, "cannot list the group (corrupt file?)");
  NamedTensors out;
  for (const auto& name : names) {
    const std::string object = detail::str_cat("/", group_name, "/", name);
    Id ds{check(H5Dopen2(group, name.c_str(), H5P_DEFAULT), path, object, "open dataset"), H5Dclose};
    Id type{H5Dget_type(ds), H5Tclose};
    Id space{H5Dget_space(ds), H5Sclose};
    const int rank = H5Sget_simple_extent_ndims(space);
    if (rank < 0 || rank > kMaxDims)
      RT_THROW("checkpoint '", path.string(), "': dataset '", object, "' has rank ", rank, " (at most ", kMaxDims, ")");
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    std::vector<int64_t> shape(dims.begin(), dims.end());
    const DType dtype = dtype_of(ds, type, path, object);
    Tensor t = Tensor::empty(Shape(std::span<const int64_t>(shape)), dtype);
    if (t.numel() > 0)
      check(H5Dread(ds, h5_types(dtype).second, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), path, object,
            "read dataset (truncated or corrupt file?)");
    out.emplace_back(name, t);
  }
  return out;
}

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) RT_THROW("cannot open '", path.string(), "' to sync it to disk");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && !directory) RT_THROW("fsync of '", path.string(), "' failed");
}

}  // namespace

void save_checkpoint(const fs::path& path, const Checkpoint& checkpoint, const SaveOptions& options) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) RT_THROW("cannot create checkpoint folder '", dir.string(), "': ", ec.message());
  const fs::path tmp = dir / detail::str_cat(".", path.filename().string(), ".tmp-", ::getpid());
  try {
    {
      std::lock_guard<std::recursive_mutex> guard(lock());
      detail::h5_silence_errors();
      Id file{check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), tmp, "", "create file"), H5Fclose};
      string_attribute(file, "format", kFormat, tmp);
      int_attribute(file, "format_version", kVersion, tmp);
      string_attribute(file, "layout", "NHWC activations, KRSC filters", tmp);
      write_group(file, "model", checkpoint.model, tmp);
      write_group(file, "optimizer", checkpoint.optimizer, tmp);
      Id meta{check(H5Gcreate2(file, "meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), tmp, "/meta", "create group"),
              H5Gclose};
      // A dataset, not an attribute: attributes are limited to 64 KiB and a config can grow.
      Id type{H5Tcopy(H5T_C_S1), H5Tclose};
      H5Tset_size(type, std::max<size_t>(1, checkpoint.meta_json.size()));
      Id space{H5Screate(H5S_SCALAR), H5Sclose};
      Id json{check(H5Dcreate2(meta, "json", type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), tmp, "/meta/json",
                    "create dataset"),
              H5Dclose};
      check(H5Dwrite(json, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, checkpoint.meta_json.data()), tmp, "/meta/json",
            "write dataset");
      check(H5Fflush(file, H5F_SCOPE_GLOBAL), tmp, "", "flush");
    }
    fsync_path(tmp, false);
    if (options.before_rename) options.before_rename();
    fs::rename(tmp, path);
    fsync_path(dir, true);
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
}

Checkpoint load_checkpoint(const fs::path& path) {
  if (!fs::exists(path)) RT_THROW("checkpoint '", path.string(), "' does not exist");
  std::lock_guard<std::recursive_mutex> guard(lock());
  detail::h5_silence_errors();
  if (H5Fis_hdf5(path.c_str()) <= 0)
    RT_THROW("checkpoint '", path.string(), "' is truncated or not an HDF5 file (HDF5: ", detail::h5_error_text(), ")");
  Id file{check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path, "", "cannot open"), H5Fclose};
  const std::string format = read_string_attribute(file, "format", path, "/");
  if (format != kFormat)
    RT_THROW("checkpoint '", path.string(), "' has format '", format, "', expected '", kFormat, "'");
  int version = 0;
  {
    Id attr{check(H5Aopen(file, "format_version", H5P_DEFAULT), path, "/", "missing attribute 'format_version'"),
            H5Aclose};
    check(H5Aread(attr, H5T_NATIVE_INT32, &version), path, "/", "read attribute 'format_version'");
  }
  if (version != kVersion)
    RT_THROW("checkpoint '", path.string(), "' has format_version ", version, "; this ringtrain reads ", kVersion);
  Checkpoint c;
  c.model = read_group(file, "model", path);
  c.optimizer = read_group(file, "optimizer", path);
  if (H5Lexists(file, "meta", H5P_DEFAULT) <= 0) RT_THROW("checkpoint '", path.string(), "' has no group '/meta'");
  Id meta{check(H5Gopen2(file, "meta", H5P_DEFAULT), path, "/meta", "open group"), H5Gclose};
  if (H5Lexists(meta, "json", H5P_DEFAULT) <= 0) RT_THROW("checkpoint '", path.string(), "' has no dataset '/meta/json'");
  Id json{check(H5Dopen2(meta, "json", H5P_DEFAULT), path, "/meta/json", "open dataset"), H5Dclose};
  Id type{H5Dget_type(json), H5Tclose};
  std::string text(H5Tget_size(type), '\0');
  check(H5Dread(json, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()), path, "/meta/json", "read dataset");
  text.erase(std::find(text.begin(), text.end(), '\0'), text.end());
  c.meta_json = text;
  return c;
}

}  // namespace ringtrain
