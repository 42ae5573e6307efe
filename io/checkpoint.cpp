// io/checkpoint.cpp: HDF5 checkpoint writer (atomic) and reader.
#include "io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "core/check.h"
#include "core/hash.h"
#include "io/files.h"
#include "io/hdf5.h"

namespace ringtrain {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "ringtrain-checkpoint";
constexpr int kVersion = 1;

h5::Where in(const fs::path& file, std::string object = {}) { return h5::Where{"checkpoint", file, std::move(object)}; }

// The checksum: Digest64 (core/hash.h) over every tensor (group, name, dtype, shape, bytes), in name order
// so that writing (caller's order) and reading (HDF5's name order) agree, then over the metadata. Stored
// as the root attribute "checksum"; a file without one (written before it existed) is accepted.
using Digests = std::vector<std::pair<std::string, uint64_t>>;

void add_digest(Digests& out, const char* group, const std::string& name, const Tensor& host) {
  Digest64 h;
  h.add(std::string_view(group)).add(std::string_view("/")).add(name).add(std::string_view(dtype_name(host.dtype())));
  for (int64_t d : host.shape()) h.add_word(static_cast<uint64_t>(d));
  h.add(host.data_ptr(), host.nbytes());
  out.emplace_back(detail::str_cat(group, "/", name), h.value());
}

std::string checksum_text(Digests digests, const std::string& meta_json) {
  std::sort(digests.begin(), digests.end());
  Digest64 h;
  for (const auto& [key, value] : digests) h.add(key).add_word(value);
  h.add(meta_json);
  char text[32];
  std::snprintf(text, sizeof text, "digest64:%016llx", static_cast<unsigned long long>(h.value()));
  return text;
}

// (file type, memory type) for a dtype; 16-bit floats travel as raw uint16.
std::pair<hid_t, hid_t> h5_types(DType t) {
  switch (t) {
    case DType::F32:
      return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT};
    case DType::F64:
      return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE};
    case DType::I32:
      return {H5T_STD_I32LE, H5T_NATIVE_INT32};
    case DType::I64:
      return {H5T_STD_I64LE, H5T_NATIVE_INT64};
    case DType::U8:
      return {H5T_STD_U8LE, H5T_NATIVE_UINT8};
    case DType::F16:
    case DType::BF16:
      return {H5T_STD_U16LE, H5T_NATIVE_UINT16};
  }
  return {H5T_NATIVE_FLOAT, H5T_NATIVE_FLOAT};
}

void write_group(hid_t file, const char* group_name, const NamedTensors& tensors, const fs::path& path,
                 Digests& digests) {
  h5::Id group(h5::check(H5Gcreate2(file, group_name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), in(path, group_name),
                         "create group"),
               H5Gclose);
  for (const auto& [name, tensor] : tensors) {
    const std::string object = detail::str_cat("/", group_name, "/", name);
    RT_CHECK(!name.empty() && name.find('/') == std::string::npos, "checkpoint: tensor name '", name,
             "' must be non-empty without '/'");
    RT_CHECK(tensor.defined(), "checkpoint: tensor '", name, "' is undefined");
    Tensor host = tensor.detach().to(Device::cpu());
    std::vector<hsize_t> dims(host.shape().begin(), host.shape().end());
    const h5::Where where = in(path, object);
    h5::Id space(h5::check(dims.empty() ? H5Screate(H5S_SCALAR)
                                        : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                           where, "create dataspace"),
                 H5Sclose);
    auto [file_type, mem_type] = h5_types(host.dtype());
    h5::Id ds(h5::check(H5Dcreate2(group, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), where,
                        "create dataset"),
              H5Dclose);
    if (host.numel() > 0)
      h5::check(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data_ptr()), where, "write dataset");
    if (host.dtype() == DType::F16 || host.dtype() == DType::BF16)
      h5::write_string_attribute(ds, "dtype", std::string(dtype_name(host.dtype())), where);
    add_digest(digests, group_name, name, host);
  }
}

DType dtype_of(hid_t ds, hid_t type, const fs::path& path, const std::string& object) {
  const h5::Where where = in(path, object);
  if (h5::attribute_exists(ds, "dtype", where)) return parse_dtype(h5::read_string_attribute(ds, "dtype", where));
  const H5T_class_t cls = h5::check(H5Tget_class(type), where, "cannot read the type class");
  const size_t size = H5Tget_size(type);
  if (size == 0) h5::fail(where, "cannot read the type size");
  if (cls == H5T_FLOAT && size == 4) return DType::F32;
  if (cls == H5T_FLOAT && size == 8) return DType::F64;
  const H5T_sign_t sign =
      cls == H5T_INTEGER ? h5::check(H5Tget_sign(type), where, "cannot read the sign") : H5T_SGN_NONE;
  if (cls == H5T_INTEGER && size == 4 && sign == H5T_SGN_2) return DType::I32;
  if (cls == H5T_INTEGER && size == 8 && sign == H5T_SGN_2) return DType::I64;
  if (cls == H5T_INTEGER && size == 1 && sign == H5T_SGN_NONE) return DType::U8;
  RT_THROW("checkpoint '", path.string(), "': dataset '", object, "' has an unsupported type (class ",
           static_cast<int>(cls), ", ", size, " bytes)");
}

NamedTensors read_group(hid_t file, const char* group_name, const fs::path& path, Digests& digests) {
  if (!h5::link_exists(file, group_name, in(path)))
    RT_THROW("checkpoint '", path.string(), "' has no group '/", group_name, "'");
  h5::Id group(h5::check(H5Gopen2(file, group_name, H5P_DEFAULT), in(path, group_name), "open group"), H5Gclose);
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
  h5::check(walked, in(path, group_name), "cannot list the group (corrupt file?)");
  NamedTensors out;
  for (const auto& name : names) {
    const std::string object = detail::str_cat("/", group_name, "/", name);
    const h5::Where where = in(path, object);
    h5::Id ds(h5::check(H5Dopen2(group, name.c_str(), H5P_DEFAULT), where, "open dataset"), H5Dclose);
    h5::Id type(h5::check(H5Dget_type(ds), where, "cannot read the type"), H5Tclose);
    const std::vector<hsize_t> dims = h5::dims(ds, where, kMaxDims);
    std::vector<int64_t> shape(dims.begin(), dims.end());
    const DType dtype = dtype_of(ds, type, path, object);
    Tensor t = Tensor::empty(Shape(std::span<const int64_t>(shape)), dtype);
    if (t.numel() > 0)
      h5::check(H5Dread(ds, h5_types(dtype).second, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), where,
                "read dataset (truncated or corrupt file?)");
    add_digest(digests, group_name, name, t);
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
      std::lock_guard<std::recursive_mutex> guard(h5::lock());
      h5::silence_errors();
      h5::Id file(h5::check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), in(tmp), "create file"),
                  H5Fclose);
      h5::write_string_attribute(file, "format", kFormat, in(tmp));
      h5::write_int_attribute(file, "format_version", {kVersion}, in(tmp));
      h5::write_string_attribute(file, "layout", "NHWC activations, KRSC filters", in(tmp));
      Digests digests;
      write_group(file, "model", checkpoint.model, tmp, digests);
      write_group(file, "optimizer", checkpoint.optimizer, tmp, digests);
      h5::write_string_attribute(file, "checksum", checksum_text(std::move(digests), checkpoint.meta_json), in(tmp));
      const h5::Where meta_json = in(tmp, "/meta/json");
      h5::Id meta(
          h5::check(H5Gcreate2(file, "meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), in(tmp, "/meta"), "create group"),
          H5Gclose);
      // A dataset, not an attribute: attributes are limited to 64 KiB and a config can grow.
      h5::Id type(h5::check(H5Tcopy(H5T_C_S1), meta_json, "copy string type"), H5Tclose);
      h5::check(H5Tset_size(type, std::max<size_t>(1, checkpoint.meta_json.size())), meta_json, "set string size");
      h5::Id space(h5::check(H5Screate(H5S_SCALAR), meta_json, "create dataspace"), H5Sclose);
      h5::Id json(h5::check(H5Dcreate2(meta, "json", type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), meta_json,
                            "create dataset"),
                  H5Dclose);
      h5::check(H5Dwrite(json, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, checkpoint.meta_json.data()), meta_json,
                "write dataset");
      h5::check(H5Fflush(file, H5F_SCOPE_GLOBAL), in(tmp), "flush");
    }
    fsync_path(tmp, false);
    if (options.before_rename) options.before_rename();
    fs::rename(tmp, path);
    fsync_path(dir, true);
  } catch (const Error& e) {
    fs::remove(tmp, ec);
    uint64_t bytes = 0;
    for (const auto* group : {&checkpoint.model, &checkpoint.optimizer})
      for (const auto& [name, t] : *group) bytes += static_cast<uint64_t>(t.nbytes());
    const std::string explained = io::explain_write_failure(dir, e.what(), bytes);
    if (explained == e.what()) throw;
    RT_THROW("checkpoint '", path.string(), "': ", explained);
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
}

namespace {

// Opens a checkpoint file and checks its format attributes. Errors name the file.
h5::Id open_checkpoint(const fs::path& path) {
  if (fs::is_directory(path))
    RT_THROW("checkpoint '", path.string(), "' is a folder, not a checkpoint file (to continue the newest checkpoint ",
             "of a folder: --checkpoint-dir ", path.string(), " --resume auto)");
  io::require_regular_file(path, "checkpoint");
  h5::silence_errors();
  if (H5Fis_hdf5(path.c_str()) <= 0)
    RT_THROW("checkpoint '", path.string(), "' is truncated or not an HDF5 file (HDF5: ", h5::error_text(), ")");
  h5::Id file(h5::check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), in(path), "cannot open"), H5Fclose);
  const std::string format = h5::read_string_attribute(file, "format", in(path, "/"));
  if (format != kFormat)
    RT_THROW("checkpoint '", path.string(), "' has format '", format, "', expected '", kFormat, "'");
  const std::vector<int32_t> version = h5::read_int_attribute(file, "format_version", in(path, "/"));
  if (version.size() != 1 || version[0] != kVersion)
    RT_THROW("checkpoint '", path.string(), "' has format_version ", version.empty() ? -1 : version[0],
             "; this ringtrain reads ", kVersion);
  return file;
}

// The text of /meta/json.
std::string read_meta(hid_t file, const fs::path& path) {
  if (!h5::link_exists(file, "meta", in(path))) RT_THROW("checkpoint '", path.string(), "' has no group '/meta'");
  h5::Id meta(h5::check(H5Gopen2(file, "meta", H5P_DEFAULT), in(path, "/meta"), "open group"), H5Gclose);
  const h5::Where meta_json = in(path, "/meta/json");
  if (!h5::link_exists(meta, "json", meta_json))
    RT_THROW("checkpoint '", path.string(), "' has no dataset '/meta/json'");
  h5::Id json(h5::check(H5Dopen2(meta, "json", H5P_DEFAULT), meta_json, "open dataset"), H5Dclose);
  h5::Id type(h5::check(H5Dget_type(json), meta_json, "cannot read the type"), H5Tclose);
  if (h5::check(H5Tget_class(type), meta_json, "cannot read the type class") != H5T_STRING || H5Tget_size(type) == 0)
    RT_THROW("checkpoint '", path.string(), "': dataset '/meta/json' is not a fixed-length string");
  std::string text(H5Tget_size(type), '\0');
  h5::check(H5Dread(json, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()), meta_json, "read dataset");
  text.erase(std::find(text.begin(), text.end(), '\0'), text.end());
  return text;
}

}  // namespace

Checkpoint load_checkpoint(const fs::path& path) {
  std::lock_guard<std::recursive_mutex> guard(h5::lock());
  h5::Id file = open_checkpoint(path);
  Checkpoint c;
  Digests digests;
  c.model = read_group(file, "model", path, digests);
  c.optimizer = read_group(file, "optimizer", path, digests);
  c.meta_json = read_meta(file, path);
  c.checksummed = h5::attribute_exists(file, "checksum", in(path, "/"));
  if (c.checksummed) {
    const std::string recorded = h5::read_string_attribute(file, "checksum", in(path, "/"));
    const std::string actual = checksum_text(std::move(digests), c.meta_json);
    if (recorded != actual)
      RT_THROW("checkpoint '", path.string(), "' is corrupt: its tensors and metadata hash to ", actual,
               " but the file records ", recorded, " (a flipped bit on disk or in transfer?); use an older checkpoint");
  }
  return c;
}

std::string read_checkpoint_meta(const fs::path& path) {
  std::lock_guard<std::recursive_mutex> guard(h5::lock());
  h5::Id file = open_checkpoint(path);
  return read_meta(file, path);
}

}  // namespace ringtrain
