// io/hdf5.cpp: the id handle, error texts and attribute helpers of io/hdf5.h.
#include "io/hdf5.h"

#include <algorithm>
#include <cstdio>

namespace ringtrain::h5 {

std::recursive_mutex& lock() {
  static std::recursive_mutex mutex;
  return mutex;
}

namespace {
herr_t collect_frame(unsigned, const H5E_error2_t* frame, void* out) {
  auto* text = static_cast<std::string*>(out);
  if (!text->empty()) *text += "; ";
  *text += frame->desc ? frame->desc : "?";
  if (frame->func_name) *text += std::string(" [") + frame->func_name + "]";
  return 0;
}
}  // namespace

std::string error_text() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_frame, &text);
  H5Eclear2(H5E_DEFAULT);
  return text.empty() ? "no HDF5 error stack" : text;
}

void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

void Id::reset() noexcept {
  if (id_ >= 0 && close_ != nullptr && close_(id_) < 0)
    std::fprintf(stderr, "ringtrain: closing an HDF5 object failed (HDF5: %s)\n", error_text().c_str());
  id_ = H5I_INVALID_HID;
}

std::string Where::text() const {
  return detail::str_cat(kind, " '", file.string(), "'",
                         object.empty() ? "" : detail::str_cat(", object '", object, "'"));
}

void fail(const Where& where, const std::string& what) {
  RT_THROW(where.text(), ": ", what, " (HDF5: ", error_text(), ")");
}

bool link_exists(hid_t loc, const char* name, const Where& where) {
  return check(H5Lexists(loc, name, H5P_DEFAULT), where, detail::str_cat("cannot look up '", name, "'")) > 0;
}

bool attribute_exists(hid_t loc, const char* name, const Where& where) {
  return check(H5Aexists(loc, name), where, detail::str_cat("cannot look up attribute '", name, "'")) > 0;
}

namespace {

// Creates attribute `name` of `file_type` and `space` on loc, replacing an existing one.
Id create_attribute(hid_t loc, const char* name, hid_t file_type, hid_t space, const Where& where) {
  if (attribute_exists(loc, name, where))
    check(H5Adelete(loc, name), where, detail::str_cat("delete attribute '", name, "'"));
  return Id(check(H5Acreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT), where,
                  detail::str_cat("create attribute '", name, "'")),
            H5Aclose);
}

Id open_attribute(hid_t loc, const char* name, const Where& where) {
  if (!attribute_exists(loc, name, where)) RT_THROW(where.text(), ": missing attribute '", name, "'");
  return Id(check(H5Aopen(loc, name, H5P_DEFAULT), where, detail::str_cat("open attribute '", name, "'")), H5Aclose);
}

template <typename T>
void write_array(hid_t loc, const char* name, hid_t mem_type, hid_t file_type, const std::vector<T>& values,
                 const Where& where) {
  const hsize_t n[1] = {values.size()};
  Id space(
      check(values.size() == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, n, nullptr), where, "create dataspace"),
      H5Sclose);
  Id attr = create_attribute(loc, name, file_type, space, where);
  check(H5Awrite(attr, mem_type, values.data()), where, detail::str_cat("write attribute '", name, "'"));
}

template <typename T>
std::vector<T> read_array(hid_t loc, const char* name, hid_t mem_type, const Where& where) {
  Id attr = open_attribute(loc, name, where);
  Id space(check(H5Aget_space(attr), where, detail::str_cat("attribute '", name, "': no dataspace")), H5Sclose);
  const hssize_t n = check(H5Sget_simple_extent_npoints(space), where, detail::str_cat("attribute '", name, "': size"));
  std::vector<T> values(static_cast<size_t>(n));
  if (n > 0) check(H5Aread(attr, mem_type, values.data()), where, detail::str_cat("read attribute '", name, "'"));
  return values;
}

}  // namespace

void write_string_attribute(hid_t loc, const char* name, const std::string& value, const Where& where) {
  Id type(check(H5Tcopy(H5T_C_S1), where, "copy string type"), H5Tclose);
  check(H5Tset_size(type, std::max<size_t>(1, value.size())), where, "set string size");
  check(H5Tset_strpad(type, H5T_STR_NULLPAD), where, "set string padding");
  Id space(check(H5Screate(H5S_SCALAR), where, "create dataspace"), H5Sclose);
  Id attr = create_attribute(loc, name, type, space, where);
  // An empty value is one NUL byte (HDF5 strings have at least one).
  const std::string stored = value.empty() ? std::string(1, '\0') : value;
  check(H5Awrite(attr, type, stored.data()), where, detail::str_cat("write attribute '", name, "'"));
}

std::string read_string_attribute(hid_t loc, const char* name, const Where& where) {
  Id attr = open_attribute(loc, name, where);
  Id type(check(H5Aget_type(attr), where, detail::str_cat("attribute '", name, "': no type")), H5Tclose);
  if (check(H5Tget_class(type), where, detail::str_cat("attribute '", name, "': type class")) != H5T_STRING)
    RT_THROW(where.text(), ": attribute '", name, "' is not a string");
  if (check(H5Tis_variable_str(type), where, detail::str_cat("attribute '", name, "': string kind")) > 0) {
    char* value = nullptr;
    Id mem(check(H5Tcopy(H5T_C_S1), where, "copy string type"), H5Tclose);
    check(H5Tset_size(mem, H5T_VARIABLE), where, "set string size");
    check(H5Aread(attr, mem, &value), where, detail::str_cat("read attribute '", name, "'"));
    std::string s = value ? value : "";
    H5free_memory(value);
    return s;
  }
  const size_t size = H5Tget_size(type);
  if (size == 0) fail(where, detail::str_cat("attribute '", name, "': string size"));
  std::string s(size, '\0');
  check(H5Aread(attr, type, s.data()), where, detail::str_cat("read attribute '", name, "'"));
  s.erase(std::find(s.begin(), s.end(), '\0'), s.end());
  return s;
}

void write_int_attribute(hid_t loc, const char* name, const std::vector<int32_t>& values, const Where& where) {
  write_array(loc, name, H5T_NATIVE_INT32, H5T_STD_I32LE, values, where);
}

void write_float_attribute(hid_t loc, const char* name, const std::vector<float>& values, const Where& where) {
  write_array(loc, name, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, values, where);
}

std::vector<int32_t> read_int_attribute(hid_t loc, const char* name, const Where& where) {
  return read_array<int32_t>(loc, name, H5T_NATIVE_INT32, where);
}

std::vector<float> read_float_attribute(hid_t loc, const char* name, const Where& where) {
  return read_array<float>(loc, name, H5T_NATIVE_FLOAT, where);
}

std::vector<hsize_t> dims(hid_t dataset, const Where& where, int max_rank) {
  Id space(check(H5Dget_space(dataset), where, "no dataspace"), H5Sclose);
  const int rank = check(H5Sget_simple_extent_ndims(space), where, "cannot read the rank");
  if (rank > max_rank) RT_THROW(where.text(), ": rank ", rank, " (at most ", max_rank, ")");
  std::vector<hsize_t> d(static_cast<size_t>(rank));
  if (rank > 0) check(H5Sget_simple_extent_dims(space, d.data(), nullptr), where, "cannot read the shape");
  return d;
}

}  // namespace ringtrain::h5
